"""One typed config per service, one prefix: a variable with the service's prefix that the
service does not read is a typo and stops it at start, naming the variable and the closest
real one; names other code reads legitimately are allow-listed, and Kubernetes service links
pass."""

import re
import sys

import pytest

from gateway.config import (OTHER_GATEWAY_VARIABLES, GatewayConfig, GatewayServerSettings)
from services.ocr_api.settings import ConfigError, Env, is_service_link
from services.ocr_worker.config import OTHER_OCR_VARIABLES, WorkerConfig, WorkerServerSettings
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


def test_other_prefixes_and_allow_listed_names_pass():
    WorkerConfig.from_env({"OCR_GRACEFUL_TIMEOUT_S": "30", "GATEWAY_WHATEVER": "x",
                           "HTTP_THREADS": "8", "WORKERS": "2"})
    GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_PROCESSES": "2", "OCR_TYPO": "x",
                            "GATEWAY_HTTP_THREADS": "8", "GATEWAY_GRACEFUL_TIMEOUT_S": "5"})
    WorkerServerSettings.from_env({"OCR_GRACEFUL_TIMEOUT_S": "30"})
    GatewayServerSettings.from_env({"GATEWAY_PROCESSES": "3"})


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


ENV_READ = re.compile(r'env\.(?:str|optional_str|choice|int|float|bool|list)\(\s*"([A-Z_]+)"')


@pytest.mark.parametrize("path, prefix, config, base, allowed", [
    ("services/ocr_worker/config.py", "OCR_", WorkerConfig, {}, OTHER_OCR_VARIABLES),
    ("gateway/config.py", "GATEWAY_", GatewayConfig, GATEWAY_BASE, OTHER_GATEWAY_VARIABLES),
])
def test_allow_lists_name_exactly_what_the_server_settings_read(monkeypatch, path, prefix,
                                                                config, base, allowed):
    """Every prefixed name in the config module is read by the config itself or allow-listed
    (for its server settings), and nothing is allow-listed that the config reads anyway."""
    in_source = {name for name in ENV_READ.findall((REPO_ROOT / path).read_text())
                 if name.startswith(prefix)}
    envs = []

    class RecordingEnv(Env):
        def __init__(self, environ=None):
            super().__init__(environ)
            envs.append(self)

    monkeypatch.setattr(sys.modules[config.__module__], "Env", RecordingEnv)
    config.from_env(base)
    read = {name for name in envs[0].read if name.startswith(prefix)}
    assert in_source - read == set(allowed)


def test_settings_read_by_a_nested_config_are_known_to_the_prefix_check():
    config = GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_JOBS_LEASE_S": "5"})
    assert config.jobs.lease_s == 5
    with pytest.raises(ConfigError, match="GATEWAY_JOBS_LEASE"):
        GatewayConfig.from_env({**GATEWAY_BASE, "GATEWAY_JOBS_LEASES": "5"})
