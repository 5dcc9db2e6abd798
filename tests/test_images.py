"""`make image-test`: the built images run the way the CPU overlay's manifests run them (uid
10001, read-only root, tmpfs for /tmp, the metrics directory in it and the cache, all
capabilities dropped, the manifests' CPU and memory limits and ConfigMap environment; see
deploy/docker/podrun.py), on the host's network at loopback addresses: a gateway that finds two
workers under the headless Service's DNS name (/etc/hosts entries here), real documents through
it, the probes, /metrics, SIGTERM drain of a worker and of the gateway, memory against the
manifests' requests. Needs `make images` first; `make test` skips this file."""

import base64
import concurrent.futures
import json
import os
import re
import time

import pytest
import requests

from deploy.docker import engine as engines
from deploy.docker import images as image_build
from deploy.docker import podrun
from deploy.k8s import kube_play, validate
from samples import documents
from scripts import fetch_layout_models, fetch_models
from scripts.fleet import free_port, port_is_taken

pytestmark = [
    pytest.mark.containers,
    pytest.mark.engine,
    pytest.mark.skipif(
        not os.environ.get("OCRFLEET_CONTAINER_TESTS"),
        reason="container tests: `make image-smoke` (CI) and `make image-test` run them"),
]

WORKER_IMAGE = image_build.tag_of("worker-cpu")
GATEWAY_IMAGE = image_build.tag_of("gateway")
GPU_STANDIN_IMAGE = image_build.tag_of("worker-gpu", standin=True)
# the one container test that needs an image `make image-smoke` (CI) does not build; the
# reason is allowed by tests/allowed_skips.txt for this case only
GPU_STANDIN_SKIP = (
    "container test needs localhost/ocrfleet-worker-gpu:standin, not built by `make image-smoke`")
WORKER_ADDRESSES = ("127.0.0.2", "127.0.0.3")  # loopback, one per worker pod: same port
FIGURES: dict[str, str] = {}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def texts(body: dict) -> list[str]:
    return [" ".join(page["prunedResult"]["rec_texts"])
            for page in body["result"]["ocrResults"]]


def shared_free_port(addresses) -> int:
    while True:
        port = free_port()
        if not any(port_is_taken(port, address) for address in addresses):
            return port


def probes(deployment: dict) -> dict[str, str]:
    """probe kind -> path, from the manifest (the port is the container's http port)."""
    container = podrun.container_spec(deployment)
    return {kind: container[kind]["httpGet"]["path"]
            for kind in ("startupProbe", "readinessProbe", "livenessProbe") if kind in container}


def startup_budget_s(deployment: dict) -> float:
    probe = podrun.container_spec(deployment)["startupProbe"]
    return probe["periodSeconds"] * probe["failureThreshold"]


@pytest.fixture(scope="module")
def engine():
    name = engines.name()
    for tag in (WORKER_IMAGE, GATEWAY_IMAGE):
        assert engines.image_exists(name, tag), f"{tag} is missing: run `make images`"
    return name


@pytest.fixture(scope="module")
def render():
    objects = validate.render("overlays/cpu")
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    return objects, deployments


@pytest.fixture(scope="module")
def fleet(engine, render, tmp_path_factory):
    """Two workers and a gateway, started as the manifests start them; removed at the end."""
    objects, deployments = render
    logs = tmp_path_factory.mktemp("container-logs")
    tag = f"{os.getpid()}"
    worker_port = shared_free_port(WORKER_ADDRESSES)
    started = []
    try:
        workers = []
        for index, address in enumerate(WORKER_ADDRESSES):
            container = podrun.Container(engine, f"ocrfleet-it-worker{index}-{tag}", logs)
            started.append(container)
            container.start(podrun.run_args(
                deployments["ocr-worker"], objects, name=container.name, image=WORKER_IMAGE,
                env={"HOST": address, "PORT": str(worker_port)}))
            workers.append((container, f"http://{address}:{worker_port}"))
        budget = startup_budget_s(deployments["ocr-worker"])
        for container, url in workers:
            seconds = container.wait_for(url + probes(deployments["ocr-worker"])["startupProbe"],
                                         budget)
            FIGURES[f"{container.name} ready after"] = f"{seconds:.0f} s (budget {budget:.0f} s)"
        replica_dns = kube_play.config_value(objects, "ocr-gateway-config",
                                             "GATEWAY_REPLICA_DNS")
        host = kube_play.dns_host(replica_dns)
        gateway_port = free_port()
        gateway = podrun.Container(engine, f"ocrfleet-it-gateway-{tag}", logs)
        started.append(gateway)
        gateway.start(podrun.run_args(
            deployments["ocr-gateway"], objects, name=gateway.name, image=GATEWAY_IMAGE,
            env={"HOST": "127.0.0.1", "PORT": str(gateway_port),
                 "GATEWAY_REPLICA_DNS": f"{host}:{worker_port}"},
            add_hosts=tuple((host, address) for address in WORKER_ADDRESSES)))
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        gateway.wait_for(gateway_url + "/readyz", startup_budget_s(deployments["ocr-gateway"]))
        yield {"workers": workers, "gateway": (gateway, gateway_url), "logs": logs,
               "deployments": deployments}
    finally:
        for container in reversed(started):
            container.remove()
        print("\n" + "\n".join(f"  {k}: {v}" for k, v in FIGURES.items()))


def test_the_manifests_security_settings_are_in_force(fleet):
    container, _ = fleet["workers"][0]
    info = container.inspect()
    host_config = info["HostConfig"]
    assert info["Config"]["User"] == "10001:10001"
    assert host_config["ReadonlyRootfs"] is True
    limits = fleet["deployments"]["ocr-worker"]["spec"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]  # the manifest's, whatever its figures are
    assert host_config["Memory"] == podrun.quantity_bytes(limits["memory"])
    assert podrun.cpus_limit(host_config) == podrun.quantity_cpus(limits["cpu"])
    assert not host_config.get("CapAdd")
    assert "no-new-privileges" in " ".join(host_config.get("SecurityOpt") or [])
    probe = ("import os, pathlib\n"
             "try:\n    pathlib.Path('/home/ocr/x').write_text('x')\n    print('writable')\n"
             "except OSError as e:\n    print('read-only', e.errno)\n"
             "print(os.getuid(), os.getgid())\n"
             "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n")
    result = engines.run(container.engine, "exec", container.name, "python", "-c", probe)
    lines = result.stdout.decode().split("\n")
    assert lines[0] == "read-only 30"  # EROFS
    assert lines[1] == "10001 10001"
    assert int(lines[2], 16) == 0, "no effective capabilities"


def test_models_in_the_image_are_the_verified_ones(engine):
    script = ("import hashlib, json, pathlib\n"
              "root = pathlib.Path('/opt/ocrfleet/models')\n"
              "print(json.dumps({str(p.relative_to(root)): hashlib.sha256(p.read_bytes())"
              ".hexdigest() for p in root.rglob('*') if p.is_file()}))")
    result = engines.run(engine, "run", "--rm", "--network=none", "--read-only",
                         "--user", "10001:10001", WORKER_IMAGE, "python", "-c", script)
    found = json.loads(result.stdout)
    expected = {f"{d}/{f}": sha for (d, f), (_, sha) in fetch_models.FILES.items()}
    # and the layout models of /layout-parsing, laid out the same way at build time
    expected |= {f"{fetch_layout_models.SUBDIR}/{name}": sha
                 for name, sha in fetch_layout_models.FILES.items()}
    assert found == expected


def test_probes_answer_on_the_manifests_paths(fleet):
    for name, url in [(c.name, u) for c, u in fleet["workers"]] + [
            (fleet["gateway"][0].name, fleet["gateway"][1])]:
        deployment = fleet["deployments"]["ocr-gateway" if "gateway" in name else "ocr-worker"]
        for kind, path in probes(deployment).items():
            assert podrun.http_status(url + path) == 200, (name, kind, path)
    # the gateway found both workers under the headless Service's name, and both are ready:
    # /fleet names them; /readyz, open to any prober, gives counts only (gateway/app.py)
    gateway_url = fleet["gateway"][1]
    workers = {url: True for _, url in fleet["workers"]}

    def replicas():
        body = requests.get(gateway_url + "/fleet", timeout=5).json()
        return {r["url"]: r["ready"] for r in body["replicas"]}

    def readyz():
        return requests.get(gateway_url + "/readyz", timeout=5)

    wait_until(lambda: replicas() == workers, 30, "both workers ready in /fleet")
    wait_until(lambda: "2 of 2" in readyz().json()["detail"], 30, "2 of 2 in /readyz")
    assert not any(url.split("//")[1] in readyz().text for url in workers)


def test_documents_through_the_gateway_come_back_in_page_order_with_their_text(fleet):
    gateway, url = fleet["gateway"]
    workers_cpu = [c.cpu_seconds() for c, _ in fleet["workers"]]
    started = time.monotonic()
    pages = 8
    response = requests.post(url + "/ocr", json={"file": b64(documents.labelled_pdf(pages))},
                             timeout=600)
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text[:500]
    body = response.json()
    assert [documents.has_page_label(t, n, pages)
            for n, t in enumerate(texts(body), start=1)] == [True] * pages, texts(body)
    used = [c.cpu_seconds() - before for (c, _), before in zip(fleet["workers"], workers_cpu)]
    FIGURES[f"{pages}-page PDF through the gateway"] = (
        f"{elapsed:.1f} s; worker CPU seconds {used[0]:.1f} + {used[1]:.1f} "
        f"(limit 2 CPUs each)")
    assert all(u > 0 for u in used), "both workers did pages"
    table = requests.post(url + "/ocr", json={"file": b64(documents.table_pdf(2))}, timeout=600)
    assert table.status_code == 200
    for number, text in enumerate(texts(table.json()), start=1):
        assert "Quarterly report" in text and documents.has_page_label(text, number, 2), text
    image = documents.text_image(["Containers read this line"])
    single = requests.post(url + "/ocr", json={"file": b64(documents.to_png(image)),
                                               "fileType": 1}, timeout=120)
    assert single.status_code == 200 and texts(single.json()) == ["Containers read this line"]
    bad = requests.post(url + "/ocr", json={"file": "###"}, timeout=30)
    assert bad.status_code == 422 and bad.json()["errorCode"] == 422


def test_the_same_worker_image_serves_layout_parsing_through_the_gateway(fleet):
    """POST /layout-parsing at the gateway, to the same workers (the one ocr-worker Deployment
    behind the headless Service) that read /ocr: a generated 2-page report (title, paragraphs,
    a ruled table) comes back as PaddleX's PP-StructureV3 answer, page by page, each with its
    Markdown; the image's own layout models, offline (docs/capacity.md "Layout parsing")."""
    from samples import layout_pages
    from tests.test_layout import paddlex_validates

    _, url = fleet["gateway"]
    request = {"file": b64(layout_pages.report_pdf(2)), "fileType": 0}
    started = time.monotonic()
    response = requests.post(url + "/layout-parsing", json=request, timeout=600)
    FIGURES["2-page report through /layout-parsing"] = f"{time.monotonic() - started:.1f} s"
    assert response.status_code == 200, response.text[:500]
    answer = response.json()
    pages = answer["result"]["layoutParsingResults"]
    assert len(pages) == 2
    for number, page in enumerate(pages, 1):
        text = page["markdown"]["text"]
        assert f"{layout_pages.TITLE} {number}" in text and "<table>" in text, text
        assert page["prunedResult"]["parsing_res_list"], page["prunedResult"]
    paddlex_validates([(request, answer)])
    laid_out = 0.0
    for _, worker_url in fleet["workers"]:
        text = requests.get(metrics_url(worker_url, WORKER_METRICS_PORT), timeout=5).text
        laid_out += metric_sum(text, "ocr_worker_stage_seconds_count", stage="layout")
    assert laid_out >= 2  # the pages were laid out by the worker pods themselves


def metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# /metrics is served on its own port in the manifests (GATEWAY_METRICS_PORT,
# OCR_METRICS_PORT in deploy/k8s/base/*.env), and answers 404 on the service port
GATEWAY_METRICS_PORT, WORKER_METRICS_PORT = 9080, 9101


def metrics_url(url: str, port: int) -> str:
    return f"{url.rsplit(':', 1)[0]}:{port}/metrics"


def test_metrics_count_the_pages_and_documents(fleet):
    requests.post(fleet["gateway"][1] + "/ocr",
                  json={"file": b64(documents.labelled_pdf(2, lines_per_page=0))}, timeout=300)
    def documents_counted() -> bool:  # a streamed answer is counted once it has gone
        gateway_metrics = requests.get(metrics_url(fleet["gateway"][1], GATEWAY_METRICS_PORT),
                                       timeout=5).text
        return metric_sum(gateway_metrics, "ocr_gateway_documents_total", outcome="ok") >= 1

    wait_until(documents_counted, 10, "the gateway to count the document")
    for _, url in fleet["workers"]:
        worker_metrics = requests.get(metrics_url(url, WORKER_METRICS_PORT), timeout=5).text
        assert metric_sum(worker_metrics, "ocr_worker_pages_total", outcome="ok") >= 1, url
        assert metric_sum(worker_metrics, "ocr_worker_ready") == 1


def test_memory_stays_within_the_manifests_requests(fleet):
    for container, _ in fleet["workers"]:
        request = podrun.quantity_bytes(podrun.container_spec(
            fleet["deployments"]["ocr-worker"])["resources"]["requests"]["memory"])
        peak = container.memory_peak_bytes()
        FIGURES[f"{container.name} peak memory"] = (
            f"{peak / 2**20:.0f} MiB (request {request / 2**20:.0f} MiB)")
        assert peak < request
    gateway, _ = fleet["gateway"]
    request = podrun.quantity_bytes(podrun.container_spec(
        fleet["deployments"]["ocr-gateway"])["resources"]["requests"]["memory"])
    peak = gateway.memory_peak_bytes()
    FIGURES[f"{gateway.name} peak memory"] = (
        f"{peak / 2**20:.0f} MiB (request {request / 2**20:.0f} MiB)")
    assert peak < request


def wait_until(predicate, deadline_s: float, what: str):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {deadline_s} s: {what}")


def inflight(url: str) -> float:
    try:
        text = requests.get(metrics_url(url, WORKER_METRICS_PORT), timeout=2).text
    except requests.RequestException:
        return 0.0
    return metric_sum(text, "ocr_worker_inflight_requests")


def test_sigterm_drains_a_worker_and_then_the_gateway_without_losing_a_page(fleet):
    (first, first_url), (_, second_url) = fleet["workers"]
    gateway, url = fleet["gateway"]
    pages = 8
    pdf = b64(documents.labelled_pdf(pages, lines_per_page=2))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pending = pool.submit(requests.post, url + "/ocr", json={"file": pdf}, timeout=600)
        wait_until(lambda: inflight(first_url) > 0, 120, "the first worker has pages")
        first.signal("TERM")  # what the kubelet sends after preStop
        assert first.wait_exit(180) == 0, first.logs()[-2000:]
        response = pending.result()
    assert response.status_code == 200, response.text[:500]
    assert [documents.has_page_label(t, n, pages)
            for n, t in enumerate(texts(response.json()), start=1)] == [True] * pages
    # the gateway: a document in flight when SIGTERM arrives is finished, then it exits 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(requests.post, url + "/ocr", json={"file": pdf}, timeout=600)
        wait_until(lambda: inflight(second_url) > 0, 120, "the gateway sends pages")
        gateway.signal("TERM")
        response = pending.result()
        assert gateway.wait_exit(180) == 0, gateway.logs()[-2000:]
    assert response.status_code == 200, response.text[:500]
    assert len(texts(response.json())) == pages


def test_gpu_images_python_layer_serves_ocr_on_cpu(engine, render, tmp_path):
    """The worker-gpu image built on the Debian stand-in base: onnxruntime-gpu (not the CPU
    package) with its CUDA provider compiled in, the worker's code and models; one page read
    on the CPU provider (no CUDA libraries in the stand-in)."""
    if not engines.image_exists(engine, GPU_STANDIN_IMAGE):  # CI builds the other two only
        pytest.skip(GPU_STANDIN_SKIP)
    check = ("import importlib.metadata as m, onnxruntime as o\n"
             "print(m.version('onnxruntime-gpu'), 'CUDAExecutionProvider' in "
             "o.get_available_providers())\n"
             "try:\n    m.version('onnxruntime'); print('cpu package present')\n"
             "except m.PackageNotFoundError:\n    print('no cpu package')\n")
    out = engines.run(engine, "run", "--rm", "--network=none", GPU_STANDIN_IMAGE,
                      "python", "-c", check).stdout.decode().split("\n")
    assert out[0].endswith("True") and out[1] == "no cpu package", out
    objects, deployments = render
    port = free_port()
    container = podrun.Container(engine, f"ocrfleet-it-gpu-standin-{os.getpid()}", tmp_path)
    try:
        container.start(podrun.run_args(
            deployments["ocr-worker"], objects, name=container.name, image=GPU_STANDIN_IMAGE,
            env={"HOST": "127.0.0.1", "PORT": str(port), "OCR_DEVICE": "cpu"}))
        url = f"http://127.0.0.1:{port}"
        container.wait_for(url + "/readyz", startup_budget_s(deployments["ocr-worker"]))
        image = documents.text_image(["GPU image on CPU"])
        response = requests.post(url + "/ocr", json={"file": b64(documents.to_png(image)),
                                                     "fileType": 1}, timeout=120)
        assert response.status_code == 200 and texts(response.json()) == ["GPU image on CPU"]
        assert re.search(r"onnxruntime", requests.get(url + "/readyz", timeout=5).text)
    finally:
        container.remove()
