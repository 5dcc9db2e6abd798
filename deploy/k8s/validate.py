"""Render every kustomize overlay of deploy/k8s and validate each object offline.

    python -m deploy.k8s.validate [-v] [--kubernetes-version X.Y.Z ...]

Rendering: `kubectl kustomize DIR` (kubectl's built-in kustomize), else a standalone
`kustomize build DIR`; with neither on PATH this says so and exits 2. Each overlay is rendered
alone and once more with each optional component (components/*) applied on top of it.

Validation: every object against the Kubernetes OpenAPI schemas that kubernetes-validate ships
(strict: unknown fields are errors), for the pinned versions below; no cluster, no network.
A built-in API group (core, apps, autoscaling, policy, *.k8s.io, ...) with no schema is an error
(the API was removed in that version). Custom resources (ServiceMonitor) have no built-in
schema: their schema check is skipped, said so in the output, and what can be checked offline
is (the ServiceMonitor selects a Service of the same render and names one of its ports). The
prometheus-adapter rule file is checked for its shape and that it serves every custom metric a
rendered HPA asks for.

Exit status: 0 when nothing is in error, 1 when something is (a render failure included), 2 when
neither kubectl nor kustomize is on PATH.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import yaml

K8S_DIR = Path(__file__).resolve().parent

# The newest Kubernetes whose schemas kubernetes-validate==1.37.0 ships (the version we target)
# and the oldest we support (the preStop `sleep` action is on by default from 1.30).
KUBERNETES_VERSIONS = ("1.37.0", "1.30.0")

OVERLAYS = ("overlays/gpu", "overlays/gpu-paddle", "overlays/cpu")
OPTIONAL_COMPONENTS = ("components/servicemonitor", "components/manual-scaling")
ADAPTER_VALUES = "prometheus-adapter/values.yaml"

OK, SKIPPED, ERROR = "ok", "skipped", "error"


class KustomizeNotFound(RuntimeError):
    """Neither kubectl nor kustomize is on PATH."""


class RenderError(RuntimeError):
    """kustomize failed on a directory."""


@dataclass(frozen=True)
class Target:
    """One rendering: an overlay, optionally with components applied on top."""

    overlay: str
    components: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return " + ".join((self.overlay,) + self.components)


@dataclass
class Finding:
    target: str
    kind: str
    name: str
    status: str  # ok | skipped | error
    detail: str = ""


@dataclass
class Report:
    versions: tuple[str, ...]
    renders: dict[str, list[dict]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.status == ERROR]

    @property
    def skipped(self) -> list[Finding]:
        return [f for f in self.findings if f.status == SKIPPED]

    @property
    def ok(self) -> bool:
        return not self.errors


def targets() -> list[Target]:
    plain = [Target(overlay) for overlay in OVERLAYS]
    combined = [Target(overlay, (component,))
                for overlay in OVERLAYS for component in OPTIONAL_COMPONENTS]
    return plain + combined


# ---- rendering -----------------------------------------------------------------------------
def kustomize_command() -> list[str]:
    """The command that renders a kustomization directory given as its last argument."""
    kubectl = shutil.which("kubectl")
    if kubectl:
        return [kubectl, "kustomize"]
    kustomize = shutil.which("kustomize")
    if kustomize:
        return [kustomize, "build"]
    raise KustomizeNotFound(
        "neither `kubectl` nor `kustomize` is on PATH: install kubectl (its `kubectl kustomize` "
        "renders the overlays offline) or a standalone kustomize binary, then run "
        "`make k8s-validate` again")


def render_dir(directory: Path) -> list[dict]:
    command = kustomize_command() + [str(directory)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RenderError(f"`{' '.join(command)}` failed:\n{result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render(target: Target | str) -> list[dict]:
    """Render one overlay (a path relative to deploy/k8s) or Target into a list of objects."""
    if isinstance(target, str):
        target = Target(target)
    if not target.components:
        return render_dir(K8S_DIR / target.overlay)
    # kustomize accepts only relative paths to other kustomizations: a throw-away
    # kustomization next to nothing, pointing back at the overlay and the components.
    with tempfile.TemporaryDirectory(prefix="ocrfleet-kustomize-") as tmp:
        def rel(path: str) -> str:
            return os.path.relpath(K8S_DIR / path, tmp)

        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [rel(target.overlay)],
            "components": [rel(c) for c in target.components],
        }
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return render_dir(Path(tmp))


# ---- schema validation ---------------------------------------------------------------------
def is_builtin_api(api_version: str) -> bool:
    """Core (v1), unqualified groups (apps, batch, autoscaling, policy) and *.k8s.io."""
    if "/" not in api_version:
        return True
    group = api_version.split("/", 1)[0]
    return "." not in group or group.endswith(".k8s.io")


def object_name(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def validate_schema(obj: dict, versions: Iterable[str]) -> tuple[str, str]:
    """(status, detail) of one object against each version's strict schema. The overlays
    share most objects, so each distinct one is checked once."""
    return _validate_schema_once(json.dumps(obj, sort_keys=True), tuple(versions))


@functools.lru_cache(maxsize=None)
def _validate_schema_once(obj_json: str, versions: tuple[str, ...]) -> tuple[str, str]:
    from kubernetes_validate import utils as kv

    if not isinstance(kv.schema_contents, functools._lru_cache_wrapper):
        # kubernetes-validate re-reads and re-parses a schema file on every call
        kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)
    obj = json.loads(obj_json)

    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    checked = []
    for version in versions:
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path) or "(root)"
            return ERROR, f"Kubernetes {version}: {path}: {exc.message}"
        except kv.SchemaNotFoundError:
            if is_builtin_api(api_version):
                return ERROR, (f"Kubernetes {version} has no {kind} in {api_version} "
                               "(removed or misspelled API version)")
            return SKIPPED, (f"schema check skipped: {kind} ({api_version}) is a custom "
                             "resource with no built-in schema")
        except kv.VersionNotSupportedError:
            return ERROR, f"kubernetes-validate has no schemas for Kubernetes {version}"
        checked.append(version)
    return OK, "strict schema " + ", ".join(checked)


# ---- checks for what has no schema ---------------------------------------------------------
def _labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def check_service_monitor(obj: dict, objects: list[dict]) -> list[str]:
    """Problems with a ServiceMonitor that an offline render can show."""
    spec = obj.get("spec") or {}
    match = (spec.get("selector") or {}).get("matchLabels") or {}
    namespace = (obj.get("metadata") or {}).get("namespace")
    if not match:
        return ["spec.selector.matchLabels is empty: it would select every Service"]
    services = [o for o in objects if o.get("kind") == "Service"
                and (o["metadata"].get("namespace") == namespace)
                and _labels_match(match, o["metadata"].get("labels") or {})]
    if len(services) != 1:
        names = [s["metadata"]["name"] for s in services]
        return [f"selector {match} matches {len(services)} Services in namespace "
                f"{namespace} ({names}); expected exactly one (each pod scraped once)"]
    port_names = {p.get("name") for p in services[0]["spec"].get("ports", [])}
    problems = []
    endpoints = spec.get("endpoints") or []
    if not endpoints:
        problems.append("spec.endpoints is empty")
    for endpoint in endpoints:
        if endpoint.get("port") not in port_names:
            problems.append(f"endpoint port {endpoint.get('port')!r} is not a port of Service "
                            f"{services[0]['metadata']['name']} ({sorted(port_names)})")
    return problems


CUSTOM_CHECKS = {("monitoring.coreos.com", "ServiceMonitor"): check_service_monitor}


def check_prometheus_rule(obj: dict) -> tuple[str, str]:
    """A PrometheusRule's spec is a Prometheus rule file: `promtool check rules` validates it
    fully (the check prometheus-operator's admission webhook makes), so it counts as checked."""
    return _promtool_check(json.dumps({"groups": (obj.get("spec") or {}).get("groups")}))


@functools.lru_cache(maxsize=None)
def _promtool_check(rules_json: str) -> tuple[str, str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        return ERROR, ("promtool is not on PATH, so the rules cannot be checked: install "
                       "Debian's prometheus package (make system-deps)")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as rules:
        rules.write(rules_json)  # JSON is YAML
        rules.flush()
        result = subprocess.run([promtool, "check", "rules", rules.name], capture_output=True,
                                text=True, timeout=60)
    if result.returncode != 0:
        return ERROR, "promtool check rules: " + (result.stdout + result.stderr).strip()
    return OK, "spec checked with `promtool check rules` (no built-in schema)"


# Custom resources that an offline tool validates completely: OK when it passes.
VERIFIED_CUSTOM = {("monitoring.coreos.com", "PrometheusRule"): check_prometheus_rule}


def validate_objects(target_name: str, objects: list[dict],
                     versions: Iterable[str]) -> list[Finding]:
    versions = tuple(versions)
    findings = []
    for obj in objects:
        kind = obj.get("kind", "?")
        name = object_name(obj)
        if not obj.get("apiVersion") or not kind or not (obj.get("metadata") or {}).get("name"):
            findings.append(Finding(target_name, kind, name, ERROR,
                                    "apiVersion, kind and metadata.name are required"))
            continue
        status, detail = validate_schema(obj, versions)
        group = obj["apiVersion"].split("/", 1)[0] if "/" in obj["apiVersion"] else ""
        check = CUSTOM_CHECKS.get((group, kind))
        verify = VERIFIED_CUSTOM.get((group, kind))
        if status == SKIPPED and verify is not None:
            status, detail = verify(obj)
        elif status == SKIPPED and check is not None:
            problems = check(obj, objects)
            if problems:
                status, detail = ERROR, "; ".join(problems)
            else:
                detail += "; checked offline: selects one Service of this render, port exists"
        findings.append(Finding(target_name, kind, name, status, detail))
    return findings


# ---- prometheus-adapter rules --------------------------------------------------------------
_GO_TEMPLATE_NEEDS = ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>")


def adapter_rules(path: Path | None = None) -> list[dict]:
    values = yaml.safe_load((path or K8S_DIR / ADAPTER_VALUES).read_text())
    return list(((values or {}).get("rules") or {}).get("custom") or [])


def _series_names(series_query: str) -> re.Pattern | None:
    """The metric-name regex of a seriesQuery: `name{...}` or `{__name__=~"re",...}`."""
    plain = re.match(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{|$)", series_query)
    if plain:
        return re.compile("^" + re.escape(plain.group(1)) + "$")
    regex = re.search(r'__name__\s*=~\s*"([^"]+)"', series_query)
    if regex:
        return re.compile(regex.group(1) if regex.group(1).startswith("^")
                          else "^(?:" + regex.group(1) + ")$")
    exact = re.search(r'__name__\s*=\s*"([^"]+)"', series_query)
    if exact:
        return re.compile("^" + re.escape(exact.group(1)) + "$")
    return None


def exposed_metric_name(rule: dict, series: str) -> str | None:
    """The custom-metrics API name a rule gives one Prometheus series, or None if it does not
    take that series (the adapter's discovery + naming steps)."""
    pattern = _series_names(rule.get("seriesQuery", ""))
    if pattern is None or not pattern.search(series):
        return None
    naming = rule.get("name") or {}
    matches = re.compile(naming.get("matches") or ".*")
    found = matches.search(series)
    if not found:
        return None
    template = naming.get("as") or ("$1" if matches.groups else "$0")
    # Go's ${1} / $1 expansion.
    return re.sub(r"\$\{?(\d+)\}?", lambda m: found.group(int(m.group(1))) or "", template)


def check_adapter_rules(rules: list[dict]) -> list[str]:
    problems = []
    if not rules:
        return ["rules.custom is empty"]
    for index, rule in enumerate(rules):
        where = f"rules.custom[{index}]"
        for key in ("seriesQuery", "resources", "name", "metricsQuery"):
            if key not in rule:
                problems.append(f"{where}: no {key}")
        if _series_names(rule.get("seriesQuery", "")) is None:
            problems.append(f"{where}: seriesQuery names no metric")
        overrides = (rule.get("resources") or {}).get("overrides") or {}
        resources = {(v or {}).get("resource") for v in overrides.values()}
        if not {"pod", "namespace"} <= resources:
            problems.append(f"{where}: resources.overrides must map labels to pod and namespace "
                            "(an HPA Pods metric is looked up per pod)")
        for needed in _GO_TEMPLATE_NEEDS:
            if needed not in rule.get("metricsQuery", ""):
                problems.append(f"{where}: metricsQuery lacks {needed}")
    return problems


def hpa_custom_metrics(objects: list[dict]) -> list[str]:
    names = []
    for obj in objects:
        if obj.get("kind") != "HorizontalPodAutoscaler":
            continue
        for metric in obj["spec"].get("metrics", []):
            if metric.get("type") in ("Pods", "Object"):
                names.append(metric[metric["type"].lower()]["metric"]["name"])
    return names


def served_by_adapter(metric: str, rules: list[dict]) -> bool:
    """Whether some rule exposes `metric` (assuming the series of that name exists)."""
    return any(exposed_metric_name(rule, metric) == metric for rule in rules)


# ---- the whole run -------------------------------------------------------------------------
def _render_or_error(target: Target) -> list[dict] | RenderError:
    try:
        return render(target)
    except RenderError as exc:
        return exc


def validate_all(versions: Iterable[str] = KUBERNETES_VERSIONS) -> Report:
    """Render every target and validate it; raises KustomizeNotFound when nothing can render."""
    versions = tuple(versions)
    kustomize_command()
    report = Report(versions)
    all_targets = list(targets())
    with ThreadPoolExecutor(4) as pool:  # each render is a kubectl process: mostly start-up
        renders = list(pool.map(_render_or_error, all_targets))
    for target, objects in zip(all_targets, renders):
        if isinstance(objects, RenderError):
            report.findings.append(Finding(target.name, "kustomization", target.overlay,
                                           ERROR, str(objects)))
            continue
        report.renders[target.name] = objects
        report.findings.extend(validate_objects(target.name, objects, versions))

    rules_file = ADAPTER_VALUES
    try:
        rules = adapter_rules()
    except (OSError, yaml.YAMLError) as exc:
        report.findings.append(Finding(rules_file, "AdapterRules", "rules.custom", ERROR,
                                       str(exc)))
        return report
    problems = check_adapter_rules(rules)
    wanted = sorted({m for objects in report.renders.values() for m in hpa_custom_metrics(objects)})
    for metric in wanted:
        if not served_by_adapter(metric, rules):
            problems.append(f"no rule exposes {metric!r}, which an HPA asks for")
    report.findings.append(Finding(
        rules_file, "AdapterRules", "rules.custom", ERROR if problems else OK,
        "; ".join(problems) if problems else
        f"{len(rules)} rule(s); serves the HPA metric(s) {', '.join(wanted) or '(none)'}; "
        "no schema (prometheus-adapter config), shape checked"))
    return report


def format_report(report: Report, verbose: bool = False) -> str:
    lines = [f"Kubernetes schemas: {', '.join(report.versions)} (kubernetes-validate, strict, "
             "offline)", ""]
    by_target: dict[str, list[Finding]] = {}
    for finding in report.findings:
        by_target.setdefault(finding.target, []).append(finding)
    width = max([len(t) for t in by_target] + [len("target")])
    lines.append(f"{'target':<{width}}  objects  ok  skipped  errors")
    for target, findings in by_target.items():
        counts = {s: sum(f.status == s for f in findings) for s in (OK, SKIPPED, ERROR)}
        lines.append(f"{target:<{width}}  {len(findings):>7}  {counts[OK]:>2}  "
                     f"{counts[SKIPPED]:>7}  {counts[ERROR]:>6}")
    shown = [f for f in report.findings if verbose or f.status != OK]
    if shown:
        lines.append("")
    for finding in shown:
        lines.append(f"{finding.status.upper():<7} {finding.target}: {finding.kind} "
                     f"{finding.name}: {finding.detail}")
    lines.append("")
    lines.append(f"{len(report.errors)} error(s), {len(report.skipped)} skipped (no built-in "
                 f"schema), {sum(f.status == OK for f in report.findings)} ok")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-version", action="append", dest="versions",
                        help=f"validate against this version (repeatable; default "
                             f"{', '.join(KUBERNETES_VERSIONS)})")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every object")
    args = parser.parse_args(argv)
    try:
        report = validate_all(tuple(args.versions or KUBERNETES_VERSIONS))
    except KustomizeNotFound as exc:
        print(f"k8s-validate: {exc}", file=sys.stderr)
        return 2
    print(format_report(report, args.verbose))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
