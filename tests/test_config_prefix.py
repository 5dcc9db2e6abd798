"""One declarative settings class per service, one prefix: a variable with the service's
prefix that the service does not read is a typo and stops it at start, naming the variable and
the closest real one; Kubernetes service links pass. Every declared variable is read, and
gunicorn's master reads them once and hands the object to the processes it forks."""

import os
import runpy
import subprocess
import sys

import pytest

from gateway.config import GatewayConfig
from services.ocr_api.settings import ConfigError, Env, is_service_link
from services.ocr_worker.config import WorkerConfig
from tests.conftest import REPO_ROOT

GATEWAY_BASE = {"GATEWAY_REPLICAS": "http://127.0.0.1:9"}


def test_env_records_every_name_it_was_asked_for():
    env = Env({"OCR_A": "1"})
    env.int("OCR_A", 0)
    env.str("OCR_B", "x")
    assert env.read == {"OCR_A", "OCR_B"}


@pytest.mark.parametrize("typo, suggestion", [
    ("OCR_MAX_PAGE", "OCR_MAX_PAGES"),
    ("OCR_THREAD", "OCR_THREADS"),
    ("OCR_QUEUESIZE", "OCR_QUEUE_SIZE"),
    ("OCR_ALLOW_URL_INPUTS", "OCR_ALLOW_URL_INPUT"),
])
def test_a_typo_in_a_worker_variable_is_an_error_with_a_suggestion(typo, suggestion):
    with pytest.raises(ConfigError) as caught:
        WorkerConfig.from_env({typo: "5"})
    assert typo in str(caught.value) and f"did you mean {suggestion}?" in str(caught.value)


def test_a_typo_in_a_gateway_variable_is_an_error_before_the_upstream_check():
    with pytest.raises(ConfigError) as caught:
        GatewayConfig.from_env({"GATEWAY_REPLICA": "http://127.0.0.1:9"})
    assert "GATEWAY_REPLICA is not a setting" in str(caught.value)
    assert "did you mean GATEWAY_REPLICAS?" in str(caught.value)


def test_an_unknown_name_without_a_close_match_points_at_the_configuration_doc():
    with pytest.raises(ConfigError) as caught:
        GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_ZZZ": "1", "GATEWAY_QQQQQQ": "2"})
    assert "docs/configuration.md" in str(caught.value) and "1 more" in str(caught.value)


def test_other_prefixes_and_gunicorns_settings_pass():
    WorkerConfig.from_env({"OCR_GRACEFUL_TIMEOUT_S": "30", "GATEWAY_WHATEVER": "x",
                           "HTTP_THREADS": "8", "WORKERS": "2", "OCR_PROCESSES": "2",
                           "OCR_INSTANCES_PER_DEVICE": "2"})
    GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_PROCESSES": "2", "OCR_TYPO": "x",
                            "GATEWAY_HTTP_THREADS": "8", "GATEWAY_GRACEFUL_TIMEOUT_S": "5"})


@pytest.mark.parametrize("name, value", [
    ("OCR_WORKER_SERVICE_HOST", "10.0.0.1"),
    ("OCR_WORKER_SERVICE_PORT", "8101"),
    ("OCR_WORKER_SERVICE_PORT_HTTP", "8101"),
    ("OCR_WORKER_PORT", "tcp://10.0.0.1:8101"),
    ("OCR_WORKER_PORT_8101_TCP", "tcp://10.0.0.1:8101"),
    ("OCR_WORKER_PORT_8101_TCP_ADDR", "10.0.0.1"),
    ("OCR_GATEWAY_PORT_8080_TCP_PROTO", "tcp"),
])
def test_kubernetes_service_links_are_not_typos(name, value):
    assert is_service_link(name, value)
    WorkerConfig.from_env({name: value})


def test_a_port_typo_is_not_mistaken_for_a_service_link():
    assert not is_service_link("GATEWAY_METRIC_PORT", "9100")
    with pytest.raises(ConfigError):
        GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_METRIC_PORT": "9100"})


@pytest.mark.parametrize("config, base", [(WorkerConfig, {}),
                                          (GatewayConfig, GATEWAY_BASE)])
def test_every_declared_variable_is_read_and_known_to_the_typo_check(monkeypatch, config, base):
    """The reader asks for every variable the class declares (its groups' and the *_FILE
    ones included), so each is known to the typo check, and for nothing else."""
    envs = []

    class RecordingEnv(Env):
        def __init__(self, environ=None):
            super().__init__(environ)
            envs.append(self)

    monkeypatch.setattr(sys.modules[Env.__module__], "Env", RecordingEnv)
    config.from_env(base)
    [env] = envs
    assert env.read == config.variables()
    assert {"OCR_API_TOKEN_FILE", "OCR_PROCESSES", "PORT"} <= WorkerConfig.variables()
    assert {"GATEWAY_JOBS_LEASE_S", "GATEWAY_CACHE_TTL_S", "GATEWAY_PROCESSES"} \
        <= GatewayConfig.variables()


def test_a_bad_value_names_its_variable_and_the_bounds():
    for environ, message in [({"OCR_MAX_PAGES": "0"}, "OCR_MAX_PAGES=0: must be >= 1"),
                             ({"OCR_PDF_DPI": "x"}, "OCR_PDF_DPI='x': expected a number"),
                             ({"OCR_ENGINE": "y"}, "expected one of paddleocr, sim"),
                             ({"OCR_WARMUP": "maybe"}, "expected true or false"),
                             ({"PORT": "9101", "OCR_METRICS_PORT": "9101"},
                              "OCR_METRICS_PORT must differ from PORT")]:
        with pytest.raises(ConfigError) as caught:
            WorkerConfig.from_env(environ)
        assert message in str(caught.value)
    with pytest.raises(ConfigError, match="GATEWAY_JOBS_RUNNERS=65: must be <= 64"):
        GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_JOBS_RUNNERS": "65"})


def test_secrets_stay_out_of_repr():
    secret = "s3cret-" + "x" * 20
    config = GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_API_KEYS": secret,
                                     "GATEWAY_WORKER_TOKEN": secret,
                                     "GATEWAY_JOBS_CALLBACK_SECRET": secret,
                                     "GATEWAY_REDIS_URL": f"redis://:{secret}@r:6379/0"})
    assert config.api_keys == (secret,) and config.worker_token == secret
    assert config.jobs.callback_secret == secret
    assert secret not in repr(config)
    worker = WorkerConfig.from_env({"OCR_API_TOKEN": secret})
    assert worker.api_tokens == (secret,) and secret not in repr(worker)


def test_the_gunicorn_master_reads_once_and_hands_the_settings_to_its_processes(monkeypatch):
    """gunicorn.conf.py (the master) reads the settings and hands them over; the app module
    a forked process imports takes that object, the environment not parsed again."""
    from services.ocr_api import settings

    monkeypatch.setattr(settings, "_HANDED_OVER", {})
    for name, value in {"OCR_QUEUE_SIZE": "7", "OCR_THREADS": "4",
                        "OCR_INSTANCES_PER_DEVICE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("services.ocr_worker.recycle.prepare_dir", lambda *a: None)
    monkeypatch.setattr("services.flask_common.prometheus.prepare_multiprocess_dir",
                        lambda *a: None)
    for _ in range(2):  # a start, then a reload (SIGHUP), which runs the file again
        conf = runpy.run_path(str(REPO_ROOT / "services/ocr_worker/gunicorn.conf.py"))
    assert conf["workers"] == 2 and conf["threads"] == 7 + 16
    calls = []
    monkeypatch.setattr(WorkerConfig, "from_env",
                        classmethod(lambda cls, *args, **kwargs: calls.append(args)))
    handed = WorkerConfig.handed_over()
    assert not calls, "the environment was parsed again"
    assert (handed.queue_size, handed.threads) == (7, 2)  # its share of the device's threads


@pytest.mark.parametrize("conf, environ, message", [
    ("gateway/gunicorn.conf.py", {}, "ocr-gateway: set exactly one of GATEWAY_UPSTREAM_URL"),
    ("services/ocr_worker/gunicorn.conf.py", {"OCR_MAX_PAGE": "5"},
     "ocr-worker: OCR_MAX_PAGE is not a setting of this service: did you mean OCR_MAX_PAGES?"),
])
def test_a_configuration_error_stops_gunicorn_at_start_with_its_message(tmp_path, conf,
                                                                        environ, message):
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("OCR_", "GATEWAY_"))}
    started = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", conf, "--check-config",
         "services.ocr_worker.wsgi:app"],
        cwd=REPO_ROOT, env={**env, **environ, "PORT": "1", "HOME": str(tmp_path),
                            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")},
        capture_output=True, text=True, timeout=60)
    assert started.returncode != 0
    assert message in started.stderr and "Traceback" not in started.stderr, started.stderr


def test_settings_read_by_a_nested_config_are_known_to_the_prefix_check():
    config = GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_JOBS_LEASE_S": "5"})
    assert config.jobs.lease_s == 5
    with pytest.raises(ConfigError, match="GATEWAY_JOBS_LEASE"):
        GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_JOBS_LEASES": "5"})
