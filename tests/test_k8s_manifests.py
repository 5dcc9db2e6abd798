"""The deployment files against the code they deploy: every kustomize overlay of deploy/k8s
(rendered with kubectl / kustomize, validated offline by deploy.k8s.validate) and the
Dockerfiles of deploy/docker. Each invariant is read from the code (routes, gunicorn defaults,
the environment variables the config modules read, the metrics the worker defines), never from
a copy of it here."""

from __future__ import annotations

import ast
import fnmatch
import re
import shlex
import tomllib
from functools import lru_cache
from pathlib import Path

import pytest

from deploy.docker import requirements as docker_requirements
from deploy.k8s import validate

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "deploy" / "docker"

WORKER, GATEWAY = "ocr-worker", "ocr-gateway"
WORKER_CODE = ("services/ocr_worker/config.py", "services/ocr_worker/gunicorn.conf.py",
               "services/ocr_api/server_settings.py")
GATEWAY_CODE = ("gateway/config.py", "gateway/gunicorn.conf.py",
                "services/ocr_api/server_settings.py")
WORKER_GUNICORN, GATEWAY_GUNICORN = WORKER_CODE[1], GATEWAY_CODE[1]
# Variables the manifests or images set for libraries, not for our config code.
THIRD_PARTY_ENV = {"CUDA_CACHE_PATH", "XDG_CACHE_HOME", "MPLCONFIGDIR", "PATH", "PYTHONPATH",
                   "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "DEBIAN_FRONTEND",
                   "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK"}
COREDNS_CACHE_S = 5  # CoreDNS's default cache TTL for cluster records

TARGETS = [t.name for t in validate.targets()]


# ---- the code, read once --------------------------------------------------------------------
@lru_cache
def _tree(relpath: str) -> ast.Module:
    return ast.parse((REPO / relpath).read_text(), relpath)


def env_names_read(*relpaths: str) -> set[str]:
    """String literals shaped like environment variable names in these modules: what the
    config code can read (Env.int("OCR_THREADS", ...), os.environ.get("PROMETHEUS_..."))."""
    names = set()
    for relpath in relpaths:
        for node in ast.walk(_tree(relpath)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"[A-Z][A-Z0-9_]+", node.value):
                names.add(node.value)
    return names


def server_settings(service: str, env: dict[str, str] | None = None):
    """What the service's gunicorn.conf.py runs with under this environment (host, port,
    processes, graceful_timeout_s): the settings class it reads, not a copy of its defaults."""
    if service == WORKER:
        from services.ocr_worker.config import WorkerConfig as Settings
    else:
        from gateway.config import GatewayConfig as Settings
    gunicorn_conf = (REPO / SERVICES[service]["gunicorn"]).read_text()
    assert f"{Settings.__name__}.from_env()" in gunicorn_conf, \
        f"{SERVICES[service]['gunicorn']} no longer reads {Settings.__name__}"
    return Settings.from_env(env or {}, check=False)  # gunicorn's side: no upstream needed


def metric_types(relpath: str = "services/ocr_worker/metrics.py") -> dict[str, str]:
    """{metric name: Counter|Gauge|Histogram|Summary} defined in a metrics module."""
    found = {}
    for node in ast.walk(_tree(relpath)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("Counter", "Gauge", "Histogram", "Summary") \
                and node.args and isinstance(node.args[0], ast.Constant):
            found[node.args[0].value] = node.func.id
    return found


@lru_cache
def worker_routes() -> frozenset[tuple[str, str]]:
    from services.ocr_worker.app import create_app
    from services.ocr_worker.config import WorkerConfig

    app = create_app(WorkerConfig(engine="sim"), start=False)
    return frozenset((rule.rule, method) for rule in app.url_map.iter_rules()
                     for method in rule.methods)


@lru_cache
def gateway_routes() -> frozenset[tuple[str, str]]:
    from gateway.app import create_app
    from gateway.config import GatewayConfig

    config = GatewayConfig.from_env({"GATEWAY_REPLICA_DNS": "ocr-worker-headless:8101"})
    app = create_app(config, start=False)
    return frozenset((rule.rule, method) for rule in app.url_map.iter_rules()
                     for method in rule.methods)


SERVICES = {
    WORKER: dict(code=WORKER_CODE, gunicorn=WORKER_GUNICORN, routes=worker_routes),
    GATEWAY: dict(code=GATEWAY_CODE, gunicorn=GATEWAY_GUNICORN, routes=gateway_routes),
}


# ---- the rendered manifests ----------------------------------------------------------------
@pytest.fixture(scope="module")
def report() -> validate.Report:
    try:
        return validate.validate_all()
    except validate.KustomizeNotFound as exc:
        pytest.skip(f"cannot render the overlays: {exc}")


def _objects(report, target) -> list[dict]:
    assert target in report.renders, f"{target} did not render: {report.errors}"
    return report.renders[target]


def of_kind(objects, kind) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def named(objects, kind, name) -> dict:
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def the_container(deployment) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{deployment['metadata']['name']}: one container per pod"
    return containers[0]


def container_env(objects, container) -> dict[str, str]:
    """The environment a container gets from envFrom ConfigMaps and env (env wins)."""
    env = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        env.update(named(objects, "ConfigMap", ref).get("data", {}))
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
    return env


def labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def selected_deployments(objects, selector) -> list[dict]:
    return [d for d in of_kind(objects, "Deployment")
            if labels_match(selector, d["spec"]["template"]["metadata"].get("labels", {}))]


def resolve_port(container, port) -> int:
    if isinstance(port, int):
        return port
    found = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert found, f"no container port named {port!r} in {container['name']}"
    return found[0]


def cpu_quantity(value) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def is_gpu_target(target: str) -> bool:
    return target.split(" + ")[0].startswith("overlays/gpu")


# ---- validation -----------------------------------------------------------------------------
@pytest.mark.slow
def test_every_overlay_renders_and_validates(report):
    assert not report.errors, "\n" + validate.format_report(report)
    assert set(report.renders) == set(TARGETS)
    assert set(report.versions) == set(validate.KUBERNETES_VERSIONS)
    # Only custom resources may skip the schema check, and each skip is said in the output.
    assert {f.kind for f in report.skipped} <= {"ServiceMonitor"}
    assert "skipped" in validate.format_report(report)


def test_the_validator_catches_what_it_should():
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
                  "spec": {"selector": {"matchLabels": {"a": "b"}},
                           "template": {"metadata": {"labels": {"a": "b"}},
                                        "spec": {"containers": [{"name": "c", "image": "i",
                                                                 "livenessProbe": {
                                                                     "httpGett": {}}}]}}}}
    removed_api = {"apiVersion": "autoscaling/v2beta2", "kind": "HorizontalPodAutoscaler",
                   "metadata": {"name": "x"}, "spec": {}}
    custom = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "x"}}
    findings = validate.validate_objects("t", [deployment, removed_api, custom],
                                         validate.KUBERNETES_VERSIONS)
    assert [f.status for f in findings] == [validate.ERROR, validate.ERROR, validate.SKIPPED]
    assert "httpGett" in findings[0].detail


# ---- one GPU per worker; threads = CPUs -------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
def test_one_gpu_per_worker_container(report, target):
    objects = _objects(report, target)
    worker = the_container(named(objects, "Deployment", WORKER))
    env = container_env(objects, worker)
    limits = worker["resources"].get("limits", {})
    requests = worker["resources"].get("requests", {})
    if is_gpu_target(target):
        assert int(limits.get("nvidia.com/gpu", 0)) == 1
        assert int(requests.get("nvidia.com/gpu", 1)) == 1
        assert env["OCR_DEVICE"] == "gpu:0"  # the device plugin's card is CUDA device 0
        assert server_settings(WORKER, env).processes == 1  # one process for the one card
    else:
        assert "nvidia.com/gpu" not in limits and "nvidia.com/gpu" not in requests
        assert env["OCR_DEVICE"] == "cpu"
    # No other container anywhere asks for a GPU.
    for deployment in of_kind(objects, "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            if container is not worker:
                assert "nvidia.com/gpu" not in str(container.get("resources", {}))


@pytest.mark.parametrize("target", TARGETS)
def test_engine_threads_equal_the_cpu_request(report, target):
    objects = _objects(report, target)
    worker = the_container(named(objects, "Deployment", WORKER))
    env = container_env(objects, worker)
    assert int(env["OCR_THREADS"]) == cpu_quantity(worker["resources"]["requests"]["cpu"])


# ---- probes, ports and environment against the code -------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("service", list(SERVICES))
def test_probe_paths_are_routes_of_the_service(report, target, service):
    container = the_container(named(_objects(report, target), "Deployment", service))
    routes = SERVICES[service]["routes"]()
    probes = {kind: container[kind]["httpGet"]
              for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    for kind, probe in probes.items():
        assert (probe["path"], "GET") in routes, f"{service} {kind}: no GET {probe['path']}"
        assert resolve_port(container, probe["port"]) == container["ports"][0]["containerPort"]
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    if service == WORKER:  # the worker is started when the model is loaded and warm
        assert probes["startupProbe"]["path"] == "/readyz"
        budget = container["startupProbe"]["periodSeconds"] * \
            container["startupProbe"]["failureThreshold"]
        assert budget >= 300, "model load + warm-up needs minutes on a cold node"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("service", list(SERVICES))
def test_ports_match_the_gunicorn_config(report, target, service):
    objects = _objects(report, target)
    deployment = named(objects, "Deployment", service)
    container = the_container(deployment)
    env = container_env(objects, container)
    default_port = server_settings(service).port
    settings = server_settings(service, env)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # the API port first (the probes use it), then /metrics on a port of its own
    assert container["ports"][0]["name"] == "http" and default_port == settings.port
    assert ports == {"http": settings.port, "metrics": settings.metrics_port}
    assert [f"0.0.0.0:{port}" for port in ports.values()] == settings.binds
    assert settings.host == "0.0.0.0", "gunicorn binds 127.0.0.1 unless HOST says otherwise"
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") == "true":
        assert int(annotations["prometheus.io/port"]) == settings.metrics_port
        assert (annotations["prometheus.io/path"], "GET") in SERVICES[service]["routes"]()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("service", list(SERVICES))
def test_configured_variables_are_read_by_the_code(report, target, service):
    objects = _objects(report, target)
    env = container_env(objects, the_container(named(objects, "Deployment", service)))
    read = env_names_read(*SERVICES[service]["code"])
    unknown = sorted(name for name in env if name not in read and name not in THIRD_PARTY_ENV)
    assert not unknown, f"{service}: the config code reads none of {unknown}"
    ours = [n for n in env if n.startswith(("OCR_", "GATEWAY_"))]
    assert all(n in read for n in ours)
    # ... and the values are ones the config accepts.
    if service == WORKER:
        from services.ocr_worker.config import WorkerConfig

        config = WorkerConfig.from_env(env)
        assert config.cache_dir == env["OCR_CACHE_DIR"]
    else:
        from gateway.config import GatewayConfig

        GatewayConfig.from_env(env)


@pytest.mark.parametrize("target", TARGETS)
def test_gateway_discovers_workers_through_the_headless_service(report, target):
    objects = _objects(report, target)
    namespace = of_kind(objects, "Namespace")[0]["metadata"]["name"]
    env = container_env(objects, the_container(named(objects, "Deployment", GATEWAY)))
    host, port = env["GATEWAY_REPLICA_DNS"].rsplit(":", 1)
    name, ns, *rest = host.split(".")
    assert ns == namespace and rest == ["svc", "cluster", "local"]
    service = named(objects, "Service", name)
    assert service["spec"]["clusterIP"] == "None", "replica discovery needs a headless Service"
    assert not service["spec"].get("publishNotReadyAddresses"), "only Ready workers in DNS"
    worker = the_container(named(objects, "Deployment", WORKER))
    # DNS gives pod IPs: the gateway connects to the container port itself.
    assert int(port) == worker["ports"][0]["containerPort"]
    assert labels_match(service["spec"]["selector"],
                        named(objects, "Deployment", WORKER)["spec"]["template"]["metadata"]
                        ["labels"])


def secret_env(container) -> dict[str, dict]:
    """{variable: secretKeyRef} of the variables a container takes from Secrets."""
    return {item["name"]: item["valueFrom"]["secretKeyRef"] for item in container.get("env", [])
            if "secretKeyRef" in item.get("valueFrom", {})}


@pytest.mark.parametrize("target", TARGETS)
def test_keys_and_tokens_come_from_one_optional_secret(report, target):
    objects = _objects(report, target)
    gateway = secret_env(the_container(named(objects, "Deployment", GATEWAY)))
    worker = secret_env(the_container(named(objects, "Deployment", WORKER)))
    assert set(gateway) == {"GATEWAY_API_KEYS", "GATEWAY_WORKER_TOKEN",
                            "GATEWAY_JOBS_CALLBACK_SECRET"}
    assert set(worker) == {"OCR_API_TOKEN"}
    for service, refs in ((GATEWAY, gateway), (WORKER, worker)):
        read = env_names_read(*SERVICES[service]["code"])
        for name, ref in refs.items():
            assert name in read, f"{service}: the config code does not read {name}"
            # optional: the fleet starts without the Secret (no authentication then)
            assert ref["optional"] is True and ref["name"] == "ocrfleet-auth"
    # the token the gateway sends is the one the workers expect
    assert gateway["GATEWAY_WORKER_TOKEN"] == worker["OCR_API_TOKEN"]
    assert not of_kind(objects, "Secret"), "no secret in the repository"


# ---- selectors --------------------------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
def test_selectors_match_pod_labels(report, target):
    objects = _objects(report, target)
    for deployment in of_kind(objects, "Deployment"):
        assert labels_match(deployment["spec"]["selector"]["matchLabels"],
                            deployment["spec"]["template"]["metadata"]["labels"])
    for service in of_kind(objects, "Service"):
        selected = selected_deployments(objects, service["spec"].get("selector", {}))
        assert len(selected) == 1, f"Service {service['metadata']['name']} selects {selected}"
        container = the_container(selected[0])
        for port in service["spec"]["ports"]:
            target_port = resolve_port(container, port.get("targetPort", port["port"]))
            assert target_port == port["port"]
            assert port["name"] == port.get("targetPort"), "a Service port maps its namesake"
    for pdb in of_kind(objects, "PodDisruptionBudget"):
        assert len(selected_deployments(objects, pdb["spec"]["selector"]["matchLabels"])) == 1
    for hpa in of_kind(objects, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        assert ref["kind"] == "Deployment"
        named(objects, "Deployment", ref["name"])
    for monitor in of_kind(objects, "ServiceMonitor"):
        match = monitor["spec"]["selector"]["matchLabels"]
        services = [s for s in of_kind(objects, "Service")
                    if labels_match(match, s["metadata"].get("labels", {}))]
        assert len(services) == 1, "each pod must be scraped once"
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
        assert services[0]["spec"].get("clusterIP") != "None"
        annotations = [d["spec"]["template"]["metadata"].get("annotations", {})
                       for d in selected_deployments(objects, services[0]["spec"]["selector"])]
        assert all(a.get("prometheus.io/scrape") != "true" for a in annotations), \
            "ServiceMonitor and scrape annotation together scrape each pod twice"


@pytest.mark.parametrize("target", TARGETS)
def test_only_the_gateway_reaches_the_workers(report, target):
    objects = _objects(report, target)
    worker_deployment = named(objects, "Deployment", WORKER)
    worker_labels = worker_deployment["spec"]["template"]["metadata"]["labels"]
    gateway_labels = named(objects, "Deployment", GATEWAY)["spec"]["template"]["metadata"][
        "labels"]
    worker_ports = {p["name"]: p for p in the_container(worker_deployment)["ports"]}
    policies = [p for p in of_kind(objects, "NetworkPolicy")
                if labels_match(p["spec"]["podSelector"].get("matchLabels", {}), worker_labels)]
    assert len(policies) == 1
    spec = policies[0]["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    same_namespace_peers = [peer for rule in spec["ingress"] for peer in rule["from"]
                            if "namespaceSelector" not in peer]
    # Inside the namespace only gateway pods; other peers are Prometheus in its own namespace.
    assert same_namespace_peers
    for peer in same_namespace_peers:
        assert labels_match(peer["podSelector"]["matchLabels"], gateway_labels)
        assert not labels_match(peer["podSelector"]["matchLabels"], worker_labels)
    for rule in spec["ingress"]:
        assert rule["from"], "an empty `from` admits everyone"
        # the gateway reaches the API port, Prometheus (another namespace) the metrics port
        expected = worker_ports["http" if any("namespaceSelector" not in peer
                                              for peer in rule["from"]) else "metrics"]
        assert {p["port"] for p in rule["ports"]} <= {expected["name"],
                                                     expected["containerPort"]}


# ---- scaling ------------------------------------------------------------------------------------
def hpas_by_target(objects) -> dict[str, dict]:
    return {h["spec"]["scaleTargetRef"]["name"]: h["spec"]
            for h in of_kind(objects, "HorizontalPodAutoscaler")}


def test_default_overlays_autoscale_both_deployments(report):
    for overlay in validate.OVERLAYS:
        assert set(hpas_by_target(_objects(report, overlay))) == {WORKER, GATEWAY}
    manual = [t for t in TARGETS if "components/manual-scaling" in t]
    assert manual and all(set(hpas_by_target(_objects(report, t))) == {GATEWAY} for t in manual)


@pytest.mark.parametrize("target", TARGETS)
def test_worker_hpa_metric_is_a_gauge_the_worker_exports(report, target):
    hpas = hpas_by_target(_objects(report, target))
    if WORKER in hpas:
        metrics = hpas[WORKER]["metrics"]
        assert [m["type"] for m in metrics] == ["Pods"]
        name = metrics[0]["pods"]["metric"]["name"]
        assert metric_types().get(name) == "Gauge", f"{name} is not a Gauge in metrics.py"
        assert validate.served_by_adapter(name, validate.adapter_rules())
    assert [(m["type"], m["resource"]["name"]) for m in hpas[GATEWAY]["metrics"]] == \
        [("Resource", "cpu")]


@pytest.mark.parametrize("target", TARGETS)
def test_replicas_and_disruption_budgets(report, target):
    objects = _objects(report, target)
    hpas = hpas_by_target(objects)
    assert hpas[GATEWAY]["minReplicas"] >= 2, "two gateways at least"
    for name in (WORKER, GATEWAY):
        deployment = named(objects, "Deployment", name)
        if name in hpas:
            # The HPA owns the number; a manifest value would reset it on every apply.
            assert "replicas" not in deployment["spec"]
            assert 1 <= hpas[name]["minReplicas"] <= hpas[name]["maxReplicas"]
            smallest = hpas[name]["minReplicas"]
        else:
            smallest = deployment["spec"]["replicas"]
            assert smallest >= 1
        strategy = deployment["spec"]["strategy"]
        assert strategy["type"] == "RollingUpdate"
        assert strategy["rollingUpdate"]["maxUnavailable"] == 0
        pdbs = [p for p in of_kind(objects, "PodDisruptionBudget")
                if selected_deployments(objects, p["spec"]["selector"]["matchLabels"])
                == [deployment]]
        assert len(pdbs) == 1
        pdb = pdbs[0]["spec"]
        # A node drain must be able to proceed at the smallest size.
        if "maxUnavailable" in pdb:
            assert int(pdb["maxUnavailable"]) >= 1
        else:
            assert int(pdb["minAvailable"]) < smallest


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("service", list(SERVICES))
def test_grace_period_covers_the_drain(report, target, service):
    objects = _objects(report, target)
    deployment = named(objects, "Deployment", service)
    pod = deployment["spec"]["template"]["spec"]
    container = the_container(deployment)
    env = container_env(objects, container)
    graceful_s = server_settings(service, env).graceful_timeout_s
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + graceful_s
    if service == WORKER:
        gateway_env = container_env(objects, the_container(named(objects, "Deployment",
                                                                 GATEWAY)))
        # The pod keeps serving until DNS and the gateway's refresh have forgotten it.
        assert pre_stop > (float(gateway_env["GATEWAY_DNS_REFRESH_S"])
                           + float(gateway_env["GATEWAY_HEALTH_INTERVAL_S"]) + COREDNS_CACHE_S)


# ---- security and writable paths ----------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("service", list(SERVICES))
def test_pods_are_non_root_with_read_only_root(report, target, service):
    objects = _objects(report, target)
    pod = named(objects, "Deployment", service)["spec"]["template"]["spec"]
    container = the_container(named(objects, "Deployment", service))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == image_uid(service)
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod.get("enableServiceLinks") is False
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert "emptyDir" in mounts["/tmp"], "gunicorn and the metrics need a writable /tmp"
    env = container_env(objects, container)
    for variable in ("OCR_CACHE_DIR", "CUDA_CACHE_PATH"):
        if variable in env:
            assert any(env[variable] == path or env[variable].startswith(path + "/")
                       for path in mounts if "emptyDir" in mounts[path]), \
                f"{variable}={env[variable]} is not on a writable volume"
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


@pytest.mark.parametrize("target", TARGETS)
def test_everything_lives_in_one_namespace(report, target):
    objects = _objects(report, target)
    namespaces = of_kind(objects, "Namespace")
    assert len(namespaces) == 1
    name = namespaces[0]["metadata"]["name"]
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {name}


def test_adapter_rules_are_well_formed():
    rules = validate.adapter_rules()
    assert validate.check_adapter_rules(rules) == []
    for name, kind in metric_types().items():
        exposed = [validate.exposed_metric_name(r, name) for r in rules]
        if any(exposed):
            assert kind == "Gauge", f"the adapter serves {name}, a {kind}; only gauges average"


# ---- Dockerfiles --------------------------------------------------------------------------------
IMAGES = {  # image -> (Dockerfile, target stage or None for the last one, service)
    "worker-cpu": ("worker-cpu.Dockerfile", None, WORKER),
    "worker-gpu": ("worker-gpu.Dockerfile", None, WORKER),
    "worker-gpu-paddle": ("worker-gpu.Dockerfile", "worker-gpu-paddle", WORKER),
    "gateway": ("gateway.Dockerfile", None, GATEWAY),
}
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|cmake|git|"
                         r"python3?-dev|python3?-venv|[a-z0-9.+-]+-dev)\b")


def dockerfile_instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    instructions, pending = [], ""
    for line in (DOCKER / name).read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    return instructions


def stages(name: str) -> tuple[list[str], dict[str, dict]]:
    order, found, current = [], {}, None
    for keyword, rest in dockerfile_instructions(name):
        if keyword == "FROM":
            parts = rest.split()
            stage = parts[parts.index("AS") + 1] if "AS" in parts else f"#{len(order)}"
            current = found[stage] = {"base": parts[0], "instructions": []}
            order.append(stage)
        elif current is not None:
            current["instructions"].append((keyword, rest))
    return order, found


def image_chain(image: str) -> list[tuple[str, str]]:
    """The instructions that make up an image: its stage and the stages it is FROM."""
    dockerfile, target, _ = IMAGES[image]
    order, found = stages(dockerfile)
    stage = target or order[-1]
    chain = []
    while stage in found:
        chain = found[stage]["instructions"] + chain
        stage = found[stage]["base"]
    return chain


def image_env(image: str) -> dict[str, str]:
    env = {}
    for keyword, rest in image_chain(image):
        if keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def image_uid(service: str) -> int:
    uids = set()
    for image, (_, _, image_service) in IMAGES.items():
        if image_service == service:
            users = [rest for keyword, rest in image_chain(image) if keyword == "USER"]
            uids.add(int(users[-1].split(":")[0]))
    assert len(uids) == 1, f"{service} images run as different users: {uids}"
    return uids.pop()


def dockerignored(path: str) -> bool:
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    path = path.rstrip("/")
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(prefix, pattern.lstrip("/").removeprefix("**/"))
               or fnmatch.fnmatch(prefix, pattern)
               for pattern in patterns for prefix in prefixes)


@pytest.mark.parametrize("image", list(IMAGES))
def test_images_run_the_service_as_non_root_with_a_healthcheck(image):
    chain = image_chain(image)
    keywords = [k for k, _ in chain]
    users = [rest for keyword, rest in chain if keyword == "USER"]
    assert users and int(users[-1].split(":")[0]) != 0, "the image must not run as root"
    assert re.fullmatch(r"\d+(:\d+)?", users[-1]), "numeric USER, so runAsNonRoot can check it"
    healthchecks = [rest for keyword, rest in chain if keyword == "HEALTHCHECK"]
    assert healthchecks and "/healthz" in healthchecks[-1] and "urllib" in healthchecks[-1]
    assert "curl" not in healthchecks[-1] and "wget" not in healthchecks[-1]
    # The command is the documented gunicorn line, and its files exist.
    cmd = ast.literal_eval([rest for keyword, rest in chain if keyword == "CMD"][-1])
    assert cmd[:2] == ["gunicorn", "-c"]
    service = IMAGES[image][2]
    assert cmd[2] == SERVICES[service]["gunicorn"] and (REPO / cmd[2]).is_file()
    module = cmd[3].split(":")[0]
    assert (REPO / (module.replace(".", "/") + ".py")).is_file()
    # No build tools and no installs in what the image is made of (the build stages do that).
    for keyword, rest in chain:
        if keyword == "RUN":
            assert "pip install" not in rest, f"{image}: pip install in the final image: {rest}"
            if "apt-get install" in rest:
                assert not BUILD_TOOLS.search(rest), f"{image}: build tools installed: {rest}"
    assert "EXPOSE" in keywords


@pytest.mark.parametrize("image", list(IMAGES))
def test_image_environment_matches_the_code(image):
    service = IMAGES[image][2]
    env = image_env(image)
    settings = server_settings(service, env)
    assert settings.host == "0.0.0.0" and settings.port == server_settings(service).port
    assert settings.processes == 1 or service != WORKER, "one worker process per device"
    read = env_names_read(*SERVICES[service]["code"])
    unknown = sorted(n for n in env if n not in read and n not in THIRD_PARTY_ENV)
    assert not unknown, f"{image}: the config code reads none of {unknown}"
    if service == WORKER:
        from services.ocr_worker.config import WorkerConfig

        config = WorkerConfig.from_env(env)
        assert config.model_dir == "/opt/ocrfleet/models"
        det_name, det_dir, rec_name, rec_dir = config.model_paths()
        assert det_dir.startswith("/opt/ocrfleet/models/") and rec_dir.startswith(
            "/opt/ocrfleet/models/")
        assert config.backend == ("paddle" if image.endswith("paddle") else "onnxruntime")
        assert config.device == ("cpu" if image == "worker-cpu" else "gpu:0")


@pytest.mark.parametrize("dockerfile", sorted({d for d, _, _ in IMAGES.values()}))
def test_dockerfile_copies_only_what_the_context_has(dockerfile):
    for keyword, rest in dockerfile_instructions(dockerfile):
        if keyword != "COPY" or rest.startswith("--from"):
            continue
        *sources, _destination = rest.split()
        for source in sources:
            assert (REPO / source).exists(), f"{dockerfile}: COPY {source}: not in the repo"
            assert not dockerignored(source), f"{dockerfile}: COPY {source}: in .dockerignore"


def test_gpu_image_never_installs_cpu_onnxruntime_beside_the_gpu_one():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    lines = docker_requirements.requirements(pyproject, ["worker"], ["onnxruntime"],
                                             ["onnxruntime-gpu==1.0"])
    names = [docker_requirements.requirement_name(line) for line in lines]
    assert "onnxruntime" not in names and names.count("onnxruntime-gpu") == 1
    _, found = stages("worker-gpu.Dockerfile")
    for stage in ("build-onnx", "build-paddle"):
        runs = " ".join(rest for keyword, rest in found[stage]["instructions"] if keyword == "RUN")
        assert "--drop onnxruntime" in runs, f"{stage} must drop CPU onnxruntime"
    # The CPU image keeps it: the worker extra must still name it.
    assert "onnxruntime" in [docker_requirements.requirement_name(r)
                             for r in docker_requirements.requirements(pyproject, ["worker"])]


# ---- /layout-parsing: one worker pool (docs/capacity.md, section 9) ------------------------------
LAYOUT_FETCH = "scripts/fetch_layout_models.py --dest /opt/ocrfleet/models"
# Worker images built without the layout models: their /layout-parsing answers 500 naming the
# missing file (the paddle variant's venv has no onnxruntime for them; docs/capacity.md says so).
WITHOUT_LAYOUT = {"worker-gpu-paddle"}
REPLICA_SOURCES = ("GATEWAY_REPLICA_DNS", "GATEWAY_REPLICAS", "GATEWAY_UPSTREAM_URL")


def model_build_runs(image: str) -> str:
    """The RUN lines of the build stages the image copies /opt/ocrfleet/models from."""
    _, found = stages(IMAGES[image][0])
    runs = []
    for keyword, rest in image_chain(image):
        if keyword == "COPY" and rest.startswith("--from=") and "/opt/ocrfleet/models" in rest:
            stage = rest.split()[0].removeprefix("--from=")
            runs += [r for k, r in found[stage]["instructions"] if k == "RUN"]
    return " ".join(runs)


@pytest.mark.parametrize("image", [i for i, (_, _, s) in IMAGES.items() if s == WORKER])
def test_worker_images_lay_out_the_layout_models_at_build_time(image):
    runs = model_build_runs(image)
    assert "/opt/ocrfleet/models" in runs, f"{image}: no model build stage found"
    assert (LAYOUT_FETCH in runs) == (image not in WITHOUT_LAYOUT), image


@pytest.mark.parametrize("target", TARGETS)
def test_one_worker_pool_serves_both_endpoints(report, target):
    """/ocr and /layout-parsing reach the same pods: one Deployment runs a worker image, the
    gateway's one replica source is the headless Service that selects it (the gateway has no
    per-endpoint setting), and the gateway and the worker both serve both routes, so
    `kubectl scale deploy/ocr-worker` and the worker HPA size the capacity of both."""
    objects = _objects(report, target)
    workers = [d for d in of_kind(objects, "Deployment")
               if the_container(d)["image"].split(":")[0].rsplit("/", 1)[-1].startswith(
                   "worker")]
    assert [d["metadata"]["name"] for d in workers] == [WORKER]
    image = the_container(workers[0])["image"].split(":")[0].rsplit("/", 1)[-1]
    assert image in IMAGES, f"{target}: {image} is built by no Dockerfile here"
    env = container_env(objects, the_container(named(objects, "Deployment", GATEWAY)))
    assert [name for name in REPLICA_SOURCES if env.get(name)] == ["GATEWAY_REPLICA_DNS"]
    service = named(objects, "Service", env["GATEWAY_REPLICA_DNS"].split(".")[0])
    assert selected_deployments(objects, service["spec"]["selector"]) == workers
    for routes in (worker_routes(), gateway_routes()):
        assert {("/ocr", "POST"), ("/layout-parsing", "POST")} <= routes
    from gateway.config import GatewayConfig

    assert not [f for f in GatewayConfig.__dataclass_fields__ if "layout" in f.lower()], \
        "a per-endpoint gateway setting: this test and docs/capacity.md section 9 need updating"


# ---- the job store ------------------------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
def test_gateways_share_the_job_store_of_the_render(report, target):
    """Every gateway replica uses the one Redis the manifests deploy (with several replicas an
    embedded per-pod store would lose jobs), which keeps its data rather than evicting it,
    and which only the gateways can reach."""
    from urllib.parse import urlsplit

    from gateway.config import GatewayConfig

    objects = _objects(report, target)
    namespace = of_kind(objects, "Namespace")[0]["metadata"]["name"]
    gateway = the_container(named(objects, "Deployment", GATEWAY))
    env = container_env(objects, gateway)
    redis_url = GatewayConfig.from_env(env).jobs.redis_url
    assert redis_url, "GATEWAY_REDIS_URL must be set: gateways are scaled to several replicas"
    parts = urlsplit(redis_url)
    name, ns, *rest = parts.hostname.split(".")
    assert ns == namespace and rest == ["svc", "cluster", "local"]
    service = named(objects, "Service", name)
    assert [p["port"] for p in service["spec"]["ports"]] == [parts.port]
    (deployment,) = selected_deployments(objects, service["spec"]["selector"])
    redis = the_container(deployment)
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == \
        "Recreate", "one Redis with its data: never two side by side"
    args = redis["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert args[args.index("--appendonly") + 1] == "yes"
    mounts = {m["mountPath"] for m in redis["volumeMounts"]}
    assert "/data" in mounts and redis["securityContext"]["readOnlyRootFilesystem"] is True
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    gateway_labels = named(objects, "Deployment", GATEWAY)["spec"]["template"]["metadata"][
        "labels"]
    (policy,) = [p for p in of_kind(objects, "NetworkPolicy")
                 if labels_match(p["spec"]["podSelector"]["matchLabels"], labels)]
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    assert peers and all(labels_match(p["podSelector"]["matchLabels"], gateway_labels)
                         and "namespaceSelector" not in p for p in peers)
    secret = [e for e in gateway.get("env", []) if e["name"] == "GATEWAY_JOBS_CALLBACK_SECRET"]
    assert secret and secret[0]["valueFrom"]["secretKeyRef"]["optional"] is True
