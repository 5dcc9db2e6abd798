"""Access control at both tiers (services/flask_common/access.py, gateway/auth.py): optional API
keys at the gateway (several for rotation, `Authorization: Bearer` or `X-API-Key`, 401 JSON
with `WWW-Authenticate` otherwise), probes and the web page open and silent about internal
addresses, /metrics on a port of its own, and a token the workers can require from the
gateway. Most tests use the Flask test client; one starts real gunicorn servers, because the
metrics port is told apart by the socket a request came in on."""

from __future__ import annotations

import pytest
import requests

from gateway.app import create_app as create_gateway
from gateway.auth import access_policy, worker_auth_headers
from gateway.config import GatewayConfig
from samples import documents
from scripts.fleet import free_port, gateway_process, stop_all, worker_process
from services.flask_common.access import AccessPolicy, KeyCheck, presented_key
from services.ocr_api.settings import ConfigError
from services.ocr_worker.app import create_app as create_worker
from services.ocr_worker.config import WorkerConfig
from tests.conftest import b64, wait_until

OLD, NEW = "old-key-0123456789abcdef", "new-key-fedcba9876543210"
TOKEN = "worker-token-0123456789"
REPLICA = "http://10.11.12.13:8101"  # never contacted: the apps are not started


def gateway(**config):
    return create_gateway(GatewayConfig(replicas=(REPLICA,), **config), start=False)


def status(client, method, path, headers=None, port=None, **kwargs):
    base = f"http://localhost:{port}" if port else "http://localhost"
    return getattr(client, method)(path, headers=headers or {}, base_url=base, **kwargs)


# ---- the pieces ----------------------------------------------------------------------------------
def test_key_check_accepts_each_configured_key_only():
    check = KeyCheck((OLD, NEW))
    assert check.accepts(OLD) and check.accepts(NEW)
    for wrong in (None, "", OLD[:-1], OLD + "x", NEW.upper(), "x" * 10_000):
        assert not check.accepts(wrong)
    assert not KeyCheck(())


@pytest.mark.parametrize("headers, key", [
    ({"Authorization": f"Bearer {OLD}"}, OLD),
    ({"Authorization": f"bearer   {OLD} "}, OLD),
    ({"X-API-Key": OLD}, OLD),
    ({"Authorization": f"Basic {OLD}"}, None),
    ({"Authorization": "Bearer "}, None),
    ({}, None),
])
def test_the_key_is_read_from_either_header(headers, key):
    assert presented_key(headers) == key


def test_keys_come_from_the_variable_and_a_mounted_file(tmp_path):
    secret = tmp_path / "api-keys"
    secret.write_text(f"# rotated 2026-01\n{NEW}\n\n{OLD}, {OLD}\n")
    config = GatewayConfig.from_env({"GATEWAY_REPLICAS": REPLICA, "GATEWAY_API_KEYS": OLD,
                                     "GATEWAY_API_KEYS_FILE": str(secret)})
    assert config.api_keys == (OLD, NEW)
    assert OLD not in repr(config) and NEW not in repr(config)
    assert OLD not in repr(access_policy(config))
    with pytest.raises(ConfigError, match="GATEWAY_API_KEYS_FILE") as error:
        GatewayConfig.from_env({"GATEWAY_REPLICAS": REPLICA,
                                "GATEWAY_API_KEYS_FILE": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="5 characters") as error:
        GatewayConfig.from_env({"GATEWAY_REPLICAS": REPLICA, "GATEWAY_API_KEYS": "short"})
    assert "short" not in str(error.value)  # the message never repeats a secret
    # one Secret value for both sides during a token rotation: the gateway sends the first,
    # the workers accept each
    rotating = f"{TOKEN}-next,{TOKEN}"
    sender = GatewayConfig.from_env({"GATEWAY_REPLICAS": REPLICA,
                                     "GATEWAY_WORKER_TOKEN": rotating})
    assert sender.worker_token == f"{TOKEN}-next" and TOKEN not in repr(sender)
    worker = WorkerConfig.from_env({"OCR_API_TOKEN": rotating})
    assert worker.api_tokens == (f"{TOKEN}-next", TOKEN) and TOKEN not in repr(worker)


def test_the_metrics_port_is_a_second_bind():
    settings = GatewayConfig.from_env({"GATEWAY_REPLICAS": REPLICA, "PORT": "8080",
                                       "GATEWAY_METRICS_PORT": "9080"})
    assert settings.binds == ["127.0.0.1:8080", "127.0.0.1:9080"]
    assert GatewayConfig.from_env({"GATEWAY_REPLICAS": REPLICA}).binds == ["127.0.0.1:8080"]
    worker = WorkerConfig.from_env({"HOST": "0.0.0.0", "OCR_METRICS_PORT": "9101"})
    assert worker.binds == ["0.0.0.0:8101", "0.0.0.0:9101"]
    with pytest.raises(ConfigError, match="differ"):
        WorkerConfig.from_env({"PORT": "9101", "OCR_METRICS_PORT": "9101"})


# ---- the gateway ------------------------------------------------------------------------------
def test_without_keys_everything_is_open_as_before():
    client = gateway().test_client()
    assert status(client, "post", "/ocr", json={"file": "QUJD"}).status_code == 422
    assert status(client, "get", "/metrics").status_code == 200


@pytest.mark.parametrize("path, method", [("/ocr", "post"), ("/metrics", "get"),
                                          ("/fleet", "get"), ("/no-such-route", "get")])
def test_every_route_needs_a_key(path, method):
    client = gateway(api_keys=(OLD,)).test_client()
    missing = status(client, method, path)
    assert missing.status_code == 401
    body = missing.get_json()
    assert body["errorCode"] == 401 and "API key" in body["errorMsg"] and body["logId"]
    assert missing.headers["WWW-Authenticate"] == 'Bearer realm="ocrfleet"'
    wrong = status(client, method, path, {"X-API-Key": NEW})
    assert wrong.status_code == 401 and NEW not in wrong.get_data(as_text=True)
    assert 'error="invalid_token"' in wrong.headers["WWW-Authenticate"]


@pytest.mark.parametrize("header", ["Authorization", "X-API-Key"])
def test_both_header_forms_and_both_keys_of_a_rotation_are_accepted(header):
    client = gateway(api_keys=(OLD, NEW)).test_client()
    for key in (OLD, NEW):
        value = f"Bearer {key}" if header == "Authorization" else key
        answer = status(client, "post", "/ocr", {header: value}, json={"file": "QUJD"})
        assert answer.status_code == 422, answer.get_json()  # past the key, at the input
        assert status(client, "get", "/metrics", {header: value}).status_code == 200
    # the rotation done: the old key is refused
    rotated = gateway(api_keys=(NEW,)).test_client()
    assert status(rotated, "get", "/metrics", {"X-API-Key": OLD}).status_code == 401
    assert status(rotated, "get", "/metrics", {"X-API-Key": NEW}).status_code == 200


def test_probes_and_the_web_page_are_open_and_say_no_addresses():
    client = gateway(api_keys=(OLD,)).test_client()
    assert status(client, "get", "/healthz").status_code == 200
    ready = status(client, "get", "/readyz")
    assert ready.status_code == 503  # not started: no replica probed yet
    assert "10.11.12.13" not in ready.get_data(as_text=True)
    assert "replicas" not in ready.get_json()
    # the web page and its files load without a key; its API calls need one
    for path in ("/", "/ui/app.js", "/ui/style.css"):
        assert status(client, "get", path).status_code == 200, path
    assert status(client, "get", "/fleet").status_code == 401
    assert status(client, "options", "/ocr").status_code == 200  # CORS preflights carry no key


def test_metrics_on_their_own_port_only():
    client = gateway(api_keys=(OLD,), metrics_port=9080).test_client()
    assert status(client, "get", "/metrics", port=9080).status_code == 200  # no key there
    key = {"X-API-Key": OLD}
    assert status(client, "get", "/metrics", key, port=8080).status_code == 404
    assert status(client, "get", "/metrics", key).status_code == 404
    assert status(client, "post", "/ocr", key, port=9080, json={}).status_code == 404
    assert status(client, "get", "/healthz", port=9080).status_code == 404
    assert status(client, "get", "/healthz", port=8080).status_code == 200


# ---- the workers' token -------------------------------------------------------------------------
def test_a_worker_with_a_token_answers_only_the_gateway_that_sends_it():
    worker = create_worker(WorkerConfig(engine="sim", api_tokens=(TOKEN,)), start=False)
    client = worker.test_client()
    assert status(client, "post", "/ocr", json={}).status_code == 401
    assert status(client, "get", "/readyz").status_code == 503  # open (loading), not 401
    assert status(client, "get", "/healthz").status_code == 200
    headers = worker_auth_headers(GatewayConfig(replicas=(REPLICA,), worker_token=TOKEN))
    assert headers == {"Authorization": f"Bearer {TOKEN}"}
    assert status(client, "post", "/ocr", headers, json={}).status_code == 503  # past the token
    assert worker_auth_headers(GatewayConfig(replicas=(REPLICA,))) == {}
    wrong = worker_auth_headers(GatewayConfig(replicas=(REPLICA,), worker_token=TOKEN + "x"))
    assert status(client, "post", "/ocr", wrong, json={}).status_code == 401


def test_the_worker_policy_has_only_the_probes_open():
    assert AccessPolicy().open_paths == frozenset({"/healthz", "/readyz"})
    assert not AccessPolicy().is_open("/ocr") and not AccessPolicy().is_open("/")


# ---- real servers: the port a request came in on ------------------------------------------------
@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A sim worker that requires TOKEN, with /metrics on its own port, and a gateway with
    keys from a mounted file, its own metrics port, sending TOKEN to the worker."""
    tmp_path = tmp_path_factory.mktemp("access")
    keys = tmp_path / "api-keys"
    keys.write_text(f"{OLD}\n{NEW}\n")
    ports = dict(zip(("worker", "worker_metrics", "gateway", "gateway_metrics"),
                     (free_port() for _ in range(4))))
    worker = worker_process(ports["worker"], {
        "OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "10", "OCR_WARMUP": "false",
        "OCR_API_TOKEN": TOKEN, "OCR_METRICS_PORT": str(ports["worker_metrics"])},
        tmp_path / "worker.log")
    front = gateway_process(ports["gateway"], {
        "GATEWAY_REPLICAS": f"http://127.0.0.1:{ports['worker']}",
        "GATEWAY_API_KEYS_FILE": str(keys), "GATEWAY_WORKER_TOKEN": TOKEN,
        "GATEWAY_METRICS_PORT": str(ports["gateway_metrics"]),
        "GATEWAY_HEALTH_INTERVAL_S": "0.2", "GATEWAY_MAX_ATTEMPTS": "1"},
        tmp_path / "gateway.log")
    try:
        worker.start(), front.start()
        worker.wait_ready(60), front.wait_ready(60)
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    finally:
        stop_all([worker, front])


IMAGE = b64(documents.to_png(documents.text_image(["x"])))


def test_real_servers_keys_token_and_metrics_ports(servers):
    worker, gateway_url = servers["worker"], servers["gateway"]
    # worker: the token, and /metrics on its own port only
    assert requests.post(f"{worker}/ocr", json={"file": IMAGE}, timeout=30).status_code == 401
    answer = requests.post(f"{worker}/ocr", json={"file": IMAGE, "visualize": False},
                           headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    metrics = requests.get(f"{servers['worker_metrics']}/metrics", timeout=10)
    assert metrics.status_code == 200 and "ocr_worker_requests_total" in metrics.text
    assert requests.get(f"{worker}/metrics", timeout=10,
                        headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404

    # gateway: keys from the mounted file, /metrics on its own port, open probes
    assert requests.post(f"{gateway_url}/ocr", json={"file": IMAGE}, timeout=30) \
        .status_code == 401
    for key in (OLD, NEW):
        refused = requests.post(f"{gateway_url}/ocr", json={"file": "QUJD"}, timeout=30,
                                headers={"X-API-Key": key})
        assert refused.status_code == 422  # the key was accepted; the input was not
    read = requests.post(f"{gateway_url}/ocr", json={"file": IMAGE, "visualize": False},
                         headers={"X-API-Key": OLD}, timeout=30)
    assert read.status_code == 200, read.text  # a streamed JSON answer: counted once sent,
    # which is just after its last byte reached the client
    def counted() -> bool:
        metrics = requests.get(f"{servers['gateway_metrics']}/metrics", timeout=10)
        assert metrics.status_code == 200
        return 'ocr_gateway_documents_total{code="200",outcome="ok"} 1.0' in metrics.text

    wait_until(counted, 10, what="the streamed answer to be counted")
    assert requests.get(f"{gateway_url}/metrics", headers={"X-API-Key": OLD},
                        timeout=10).status_code == 404
    ready = requests.get(f"{gateway_url}/readyz", timeout=10)
    assert ready.status_code == 200 and worker.rsplit(":", 1)[1] not in ready.text
    assert requests.get(f"{servers['gateway_metrics']}/ocr", timeout=10).status_code == 404


def test_the_gateway_sends_the_worker_token(servers):
    answer = requests.post(f"{servers['gateway']}/ocr", json={"file": IMAGE, "visualize": False},
                           headers={"X-API-Key": OLD}, timeout=60)
    assert answer.status_code == 200, answer.text
