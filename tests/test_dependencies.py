"""Dependencies: every third-party package the services import is declared in pyproject.toml,
the lock files pin every declared requirement at a version its specifier allows (a floor
raised without `make lock` fails here), every pin carries a hash, and the audit's reading of
pip-audit's report (what was checked, skipped, found) is right. No network."""

import ast
import importlib.metadata
import json
import re
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

from scripts import deps
from tests.conftest import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
SERVICE_CODE = {"gateway": ["gateway", "services/ocr_api", "services/flask_common",
                            "services/documents"],
                "worker": ["services"]}
FIRST_PARTY = {"services", "gateway", "loadtest", "samples", "scripts", "deploy", "tests"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(service: str) -> list[Requirement]:
    extras = deps.LOCKS[service]
    lines = PROJECT["dependencies"] + [line for extra in extras
                                       for line in PROJECT["optional-dependencies"][extra]]
    return [Requirement(line) for line in lines]


def imported_top_level(folders: list[str]) -> set[str]:
    names = set()
    for folder in folders:
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names - FIRST_PARTY - set(sys.stdlib_module_names) - {"__future__"}


@pytest.mark.parametrize("service", list(SERVICE_CODE))
def test_every_imported_package_is_declared(service):
    distributions = importlib.metadata.packages_distributions()
    names = {canonical(r.name) for r in declared(service)}
    undeclared = {}
    for module in imported_top_level(SERVICE_CODE[service]):
        owners = {canonical(d) for d in distributions.get(module, [])}
        if not owners & names:
            undeclared[module] = sorted(owners)
    assert not undeclared, f"{service}: imported but not in pyproject.toml: {undeclared}"


def lock_pins(service: str) -> dict[str, str]:
    text = deps.lock_path(service).read_text()
    return {canonical(name): version
            for name, version in re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", text, re.M)}


@pytest.mark.parametrize("service", list(deps.LOCKS))
def test_lock_pins_every_declared_requirement_within_its_specifier(service):
    pins = lock_pins(service)
    for requirement in declared(service):
        name = canonical(requirement.name)
        assert name in pins, f"{service}.lock lacks {name}: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), \
            f"{service}.lock pins {name}=={pins[name]}, outside {requirement}: run `make lock`"


@pytest.mark.parametrize("service", list(deps.LOCKS))
def test_every_pin_has_a_hash(service):
    text = deps.lock_path(service).read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text)
    pinned = [block for block in blocks if re.match(r"[A-Za-z0-9._-]+==", block)]
    assert pinned and all("--hash=sha256:" in block for block in pinned)


def test_floors_sit_above_the_known_advisories():
    floors = {canonical(r.name): r.specifier for r in declared("worker")}
    for name, vulnerable in [("pillow", "10.2.0"), ("requests", "2.32.3"),
                             ("werkzeug", "3.0.5"), ("urllib3", "2.2.1")]:
        assert not floors[name].contains(vulnerable), f"{name} {vulnerable} still allowed"


def test_the_gateway_lock_has_no_engine():
    pins = lock_pins("gateway")
    assert not {"paddleocr", "paddlex", "onnxruntime", "numpy",
                "opencv-contrib-python"} & set(pins)


def test_audit_report_is_sorted_into_checked_skipped_and_found():
    report = {"dependencies": [
        {"name": "flask", "version": "3.1.3", "vulns": []},
        {"name": "pillow", "version": "10.0.0",
         "vulns": [{"id": "PYSEC-1", "fix_versions": ["10.3.0"]}]},
        {"name": "foo", "skip_reason": "Dependency not found on PyPI"},
    ], "fixes": []}
    outcome = deps.read_audit_json(json.dumps(report))
    assert outcome.audited == ["flask==3.1.3", "pillow==10.0.0"]
    assert outcome.findings == ["pillow 10.0.0: PYSEC-1 (fixed in 10.3.0)"]
    assert outcome.skipped == ["foo: Dependency not found on PyPI"]


def test_an_unreachable_service_skips_the_audit_instead_of_passing_it(monkeypatch, capsys):
    """pip-audit reports every package as "not found" when its service can't be reached:
    that must read as "no service", not as "no vulnerabilities"."""
    all_skipped = deps.AuditOutcome([], ["flask: Dependency not found on PyPI"], [])
    monkeypatch.setattr(deps, "ensure_tool", lambda module, group: True)
    monkeypatch.setattr(deps, "run_pip_audit", lambda files, service, timeout_s: all_skipped)
    assert deps.audit() == 0
    assert "audit skipped" in capsys.readouterr().out

    found = deps.AuditOutcome(["pillow==10.0.0"], [], ["pillow 10.0.0: PYSEC-1 (fixed in 10.3)"])
    monkeypatch.setattr(deps, "run_pip_audit", lambda files, service, timeout_s: found)
    assert deps.audit() == 1
    assert "VULNERABLE: pillow" in capsys.readouterr().out


def test_lock_command_targets_the_images_platform():
    command = deps.compile_command("worker")
    assert command[command.index("--python-version") + 1] == "3.11"
    assert "x86_64" in command[command.index("--python-platform") + 1]
    assert "--generate-hashes" in command and command[command.index("--extra") + 1] == "worker"
    assert "--extra" not in deps.compile_command("gateway")
