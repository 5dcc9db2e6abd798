"""`make image-test`, part 2: the rendered CPU overlay's Deployments played with `podman kube
play` (deploy/k8s/kube_play.py picks what it can run and points the images at the local tags):
the worker pod and the gateway pod start with the manifests' security settings and limits,
answer their probes on the manifests' paths, and the gateway pod reads a document with the
worker pod. What kube play cannot check is listed in deploy/k8s/README.md. Needs `make images`;
`make test` skips this file."""

import base64
import json
import os
import time

import pytest
import requests
import yaml

from deploy.docker import engine as engines
from deploy.docker import podrun
from deploy.k8s import kube_play, validate
from samples import documents
from scripts.fleet import free_port

pytestmark = [
    pytest.mark.containers,
    pytest.mark.engine,
    pytest.mark.skipif(
        not os.environ.get("OCRFLEET_CONTAINER_TESTS"),
        reason="container tests: `make image-smoke` (CI) and `make image-test` run them"),
]


def pod_containers(engine: str, pod: str) -> tuple[dict, list[dict]]:
    """(the pod's infra container, its other containers), inspected."""
    info = json.loads(engines.run(engine, "pod", "inspect", pod).stdout)
    info = info[0] if isinstance(info, list) else info
    ids = [c["Id"] for c in info["Containers"]]
    inspected = json.loads(engines.run(engine, "inspect", "--type", "container", *ids).stdout)
    infra = [c for c in inspected if c["Id"] == info["InfraContainerID"]]
    return infra[0], [c for c in inspected if c["Id"] != info["InfraContainerID"]]


def pod_ip(infra: dict) -> str:
    networks = infra["NetworkSettings"]["Networks"]
    addresses = [n["IPAddress"] for n in networks.values() if n.get("IPAddress")]
    assert addresses, f"the pod has no address: {networks}"
    return addresses[0]


def play(engine: str, objects: list[dict], path, volumes: list) -> str:
    """kube play the objects (the last one a Deployment), its ports on free loopback ports of
    the host; the pod's name. The volumes it will create are added to `volumes`."""
    deployment, names = kube_play.for_podman(
        objects[-1], {port: free_port() for port in kube_play.container_ports(objects[-1])})
    volumes.extend(names)
    objects = objects[:-1] + [deployment]
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    engines.run(engine, "kube", "play", "--replace", str(path))
    deployment = objects[-1]["metadata"]["name"]
    pods = json.loads(engines.run(engine, "pod", "ps", "--format", "json").stdout)
    names = [p["Name"] for p in pods if p["Name"].startswith(deployment + "-pod")]
    assert len(names) == 1, names
    return names[0]


def wait_for(url: str, deadline_s: float, engine: str, pod: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        if podrun.http_status(url) == 200:
            return time.monotonic() - started
        time.sleep(0.5)
    logs = engines.run(engine, "pod", "logs", pod, check=False)
    raise AssertionError(f"{url}: not 200 within {deadline_s} s\n"
                         f"{(logs.stdout + logs.stderr).decode(errors='replace')[-3000:]}")


def probe_urls(deployment: dict, address: str) -> dict[str, str]:
    container = podrun.container_spec(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    urls = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[kind]["httpGet"]
        port = ports.get(get["port"], get["port"])
        urls[kind] = f"http://{address}:{port}{get['path']}"
    return urls


def budget_s(deployment: dict) -> float:
    probe = podrun.container_spec(deployment)["startupProbe"]
    return probe["periodSeconds"] * probe["failureThreshold"]


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    engine = engines.name()
    for tag in kube_play.LOCAL_IMAGES.values():
        assert engines.image_exists(engine, tag), f"{tag} is missing: run `make images`"
    work = tmp_path_factory.mktemp("kube-play")
    objects = validate.render("overlays/cpu")
    worker_objects, left_out = kube_play.playable(objects, ("ocr-worker",))
    gateway_objects, _ = kube_play.playable(objects, ("ocr-gateway",))
    files = [work / "worker.yaml", work / "gateway.yaml"]
    volumes: list[str] = []
    try:
        worker_pod = play(engine, worker_objects, files[0], volumes)
        worker_infra, worker_containers = pod_containers(engine, worker_pod)
        worker_ip = pod_ip(worker_infra)
        worker = worker_objects[-1]
        seconds = wait_for(probe_urls(worker, worker_ip)["startupProbe"], budget_s(worker),
                           engine, worker_pod)
        print(f"\n  worker pod {worker_pod} ({worker_ip}) ready after {seconds:.0f} s")
        host = kube_play.dns_host(kube_play.config_value(objects, "ocr-gateway-config",
                                                         "GATEWAY_REPLICA_DNS"))
        gateway = kube_play.with_host_aliases(gateway_objects[-1], host, [worker_ip])
        gateway_pod = play(engine, gateway_objects[:-1] + [gateway], files[1], volumes)
        gateway_infra, gateway_containers = pod_containers(engine, gateway_pod)
        gateway_ip = pod_ip(gateway_infra)
        wait_for(probe_urls(gateway, gateway_ip)["readinessProbe"], budget_s(gateway),
                 engine, gateway_pod)
        yield {"engine": engine, "left_out": left_out,
               "worker": (worker, worker_ip, worker_containers),
               "gateway": (gateway, gateway_ip, gateway_containers)}
    finally:
        for path in reversed(files):
            if path.exists():
                engines.run(engine, "kube", "down", str(path), check=False)
        for volume in volumes:
            engines.run(engine, "volume", "rm", "--force", volume, check=False)


def test_what_kube_play_is_not_given_is_what_the_readme_lists(pods):
    readme = (validate.K8S_DIR / "README.md").read_text()
    section = readme.split("## What `podman kube play` checks", 1)[1].split("\n## ", 1)[0]
    for kind in sorted({name.split("/")[0] for name in pods["left_out"]} - {"ConfigMap",
                                                                            "Deployment"}):
        assert kind in section, f"{kind} is left out of kube play but not listed"


def test_pods_run_with_the_manifests_security_settings_and_limits(pods):
    for role in ("worker", "gateway"):
        deployment, _, containers = pods[role]
        assert len(containers) == 1
        info = containers[0]
        spec = podrun.container_spec(deployment)
        assert info["State"]["Running"], info["State"]
        assert info["Config"]["User"].split(":")[0] == "10001"
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert not info["HostConfig"].get("CapAdd")
        limits = spec["resources"]["limits"]
        assert info["HostConfig"]["Memory"] == podrun.quantity_bytes(limits["memory"]), role
        assert podrun.cpus_limit(info["HostConfig"]) == podrun.quantity_cpus(limits["cpu"])


def test_pods_answer_their_probes(pods):
    for role in ("worker", "gateway"):
        deployment, address, _ = pods[role]
        for kind, url in probe_urls(deployment, address).items():
            assert podrun.http_status(url) == 200, (role, kind, url)


def test_the_gateway_pod_reads_a_document_with_the_worker_pod(pods):
    _, address, _ = pods["gateway"]
    pages = 3
    pdf = base64.b64encode(documents.labelled_pdf(pages)).decode("ascii")
    response = requests.post(f"http://{address}:8080/ocr", json={"file": pdf}, timeout=600)
    assert response.status_code == 200, response.text[:500]
    texts = [" ".join(p["prunedResult"]["rec_texts"])
             for p in response.json()["result"]["ocrResults"]]
    assert [documents.has_page_label(t, n, pages)
            for n, t in enumerate(texts, start=1)] == [True] * pages, texts
    _, worker_ip, _ = pods["worker"]
    # /metrics has its own port in the manifests (OCR_METRICS_PORT, deploy/k8s/base/worker.env)
    metrics = requests.get(f"http://{worker_ip}:9101/metrics", timeout=5).text
    assert any(line.startswith('ocr_worker_pages_total{outcome="ok"}') and
               float(line.split()[-1]) >= pages for line in metrics.splitlines())
