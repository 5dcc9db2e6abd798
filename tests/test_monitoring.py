"""deploy/monitoring: the alert and recording rules, the Grafana dashboard, and a real scrape.

- `promtool check rules` and `promtool test rules` (synthetic series: every alert fires when it
  should and stays quiet when it should not). promtool comes with Debian's prometheus package
  (scripts/install_system_deps.sh); without it these tests fail, naming it.
- The PrometheusRule the k8s manifests apply is generated from rules.yaml and agrees with it.
- Every metric a rule or a dashboard query names is one the services export: the names are
  scraped from a running fleet on loopback (a gateway, two sim-engine workers and a replica
  that drops every /ocr connection, after an /ocr document, a 429, a job with a callback that
  fails once) - not read from the code.
- A real scrape: Debian's prometheus binary, on loopback, scrapes that fleet every second
  (with the rules loaded) while a few documents go through; pages/s and queue depth are
  queried through its HTTP API."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import requests
import yaml

from deploy.monitoring import render
from samples import documents
from scripts.fleet import ManagedProcess, free_port, gateway_process, stop_all, worker_process
from tests.conftest import LoopbackServer, b64, wait_until
from tests.test_jobs_callbacks import Receiver

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

MONITORING = Path(render.__file__).resolve().parent
RULES = MONITORING / "rules.yaml"
DASHBOARD = MONITORING / "dashboard.json"
SIM = {"OCR_ENGINE": "sim", "OCR_SIM_PAGE_MS": "100", "OCR_WARMUP": "false",
       "OCR_VISUALIZE": "false", "OCR_PROCESSES": "1", "OCR_THREADS": "1"}


def tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file()
                                  else None)
    if path is None:
        pytest.fail(f"`{name}` is not installed: it comes with Debian's prometheus package "
                    "(bash scripts/install_system_deps.sh --require, or "
                    "apt-get install --no-install-recommends prometheus)")
    return path


# ---- promtool ------------------------------------------------------------------------------
def test_promtool_checks_the_rules():
    result = subprocess.run([tool("promtool"), "check", "rules", str(RULES)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert():
    tests = sorted((MONITORING / "tests").glob("*.yaml"))
    assert tests
    result = subprocess.run([tool("promtool"), "test", "rules", *map(str, tests)],
                            capture_output=True, text=True, timeout=120, cwd=MONITORING)
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    fired, quiet = set(), set()
    for path in tests:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alerts - fired == set(), "alerts no unit test sees firing"
    assert alerts - quiet == set(), "alerts no unit test sees quiet"


def test_the_prometheusrule_is_generated_from_the_rules():
    assert render.PROMETHEUS_RULE.read_text() == render.render(), \
        "deploy/monitoring/prometheusrule.yaml is stale: python -m deploy.monitoring.render"


# ---- metric names in the rules and the dashboard -------------------------------------------
PROMQL_WORDS = {
    # aggregations, keywords, operators
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "offset", "bool", "inf", "nan",
    # functions
    "rate", "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "abs",
    "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max",
    "clamp_min", "count_over_time", "day_of_month", "day_of_week", "days_in_month", "exp",
    "floor", "hour", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2",
    "max_over_time", "min_over_time", "minute", "month", "predict_linear",
    "present_over_time", "quantile_over_time", "resets", "round", "scalar", "sgn", "sort",
    "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "time",
    "timestamp", "vector", "year",
}


def metric_names(expr: str) -> set[str]:
    """The metric (and recording-rule) names an expression reads."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1",
                  text)  # label lists
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)", text):
        word = match.group(1)
        after = text[match.end():].lstrip()
        if word.lower() in PROMQL_WORDS or (after.startswith("(") and ":" not in word):
            continue
        names.add(word)
    return names


def rule_expressions() -> tuple[list[str], set[str]]:
    """(every rule's expression, the recording rules' names)."""
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    return [r["expr"] for r in rules], {r["record"] for r in rules if "record" in r}


def dashboard_expressions() -> list[str]:
    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in panels(board["panels"]) for t in p.get("targets", [])]


def test_the_name_parser():
    assert metric_names('histogram_quantile(0.95, sum by (le, stage) (rate('
                        'x_seconds_bucket{stage="a b(c)"}[5m]))) > 0.25 * y:z') == \
        {"x_seconds_bucket", "y:z"}
    assert metric_names("(a > 0) unless on (job, instance) (increase(b[5m]) > 0)") == {"a", "b"}


def exported(text: str) -> set[str]:
    """Sample names and declared families of a /metrics page."""
    names = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    names |= set(re.findall(r"^([A-Za-z_:][A-Za-z0-9_:]*)[{ ]", text, re.M))
    return names


def known(name: str, names: set[str]) -> bool:
    if name in names:
        return True
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return base != name and base in names and f"{base}_count" in names


def test_every_metric_in_the_rules_and_the_dashboard_is_exported(fleet):
    names = set()
    for url in (fleet["gateway"], *fleet["workers"]):
        names |= exported(requests.get(f"{url}/metrics", timeout=10).text)
    expressions, recorded = rule_expressions()
    used = {n for e in expressions + dashboard_expressions() for n in metric_names(e)}
    assert used, "no names parsed"
    missing = {n for n in used - recorded if not known(n, names)}
    assert not missing, f"named in rules or dashboard, exported by no service: {sorted(missing)}"
    undefined = {n for n in used if ":" in n} - recorded
    assert not undefined, f"recording rules used but not defined: {sorted(undefined)}"
    # the fault replica: a retry and an ejection were seen
    assert any(n.startswith("ocr_gateway_retries_total") for n in names)


# ---- a running fleet -----------------------------------------------------------------------
class DroppingReplica:
    """Answers /readyz 200 and drops the connection of every /ocr: a replica that is up and
    fails every page (the gateway retries elsewhere and ejects it)."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path.startswith("/readyz") else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                self.close_connection = True
                self.connection.close()

            def log_message(self, *args):
                pass

        self.server = LoopbackServer(Handler)
        self.url = self.server.url

    def close(self):
        self.server.close()


def pdf(pages: int) -> str:
    return b64(documents.labelled_pdf(pages, lines_per_page=0))


def gauge(url: str, name: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=5).text
    match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    logs = tmp_path_factory.mktemp("monitoring")
    ports = [free_port(), free_port()]
    dropping = DroppingReplica()
    processes = [worker_process(port, SIM, logs / f"worker-{port}.log") for port in ports]
    workers = [f"http://127.0.0.1:{port}" for port in ports]
    gateway_port = free_port()
    processes.append(gateway_process(gateway_port, {
        "GATEWAY_REPLICAS": ",".join(workers + [dropping.url]), "GATEWAY_PROCESSES": "1",
        "GATEWAY_HEALTH_INTERVAL_S": "0.5", "GATEWAY_QUEUE_PAGES": "6",
        "GATEWAY_JOBS_DB": str(logs / "jobs.sqlite3"),
        "GATEWAY_JOBS_CALLBACK_ALLOW_PRIVATE": "true",
        "GATEWAY_JOBS_CALLBACK_SECRET": "monitoring-test-secret-0123456789",
        "GATEWAY_JOBS_CALLBACK_BACKOFF_S": "0.2", "GATEWAY_CACHE_ENABLED": "true",
        "GATEWAY_CACHE_PATH": str(logs / "cache.sqlite3")}, logs / "gateway.log"))
    gateway = f"http://127.0.0.1:{gateway_port}"
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.wait_ready(120)
        answer = requests.post(f"{gateway}/ocr", json={"file": pdf(3)}, timeout=60)
        assert answer.status_code == 200, answer.text
        # the page cache looked up (a bypass here: the dropping replica reports no engine)
        wait_until(lambda: "ocr_gateway_cache_lookups_total{" in
                   requests.get(f"{gateway}/metrics", timeout=5).text, 30,
                   what="a page cache lookup")
        # a 429: a second document while the first fills the queue
        first = threading.Thread(target=requests.post, args=(f"{gateway}/ocr",),
                                 kwargs={"json": {"file": pdf(6)}, "timeout": 60})
        first.start()
        wait_until(lambda: gauge(gateway, "ocr_gateway_queued_pages") > 0, 30,
                   what="the first document queued")
        # 7 pages: more than the whole queue (6), so refused for as long as any page of the
        # first document is still queued, not only while 4 or more are (a 100 ms race)
        refused = requests.post(f"{gateway}/ocr", json={"file": pdf(7)}, timeout=60)
        first.join(60)
        assert refused.status_code == 429, refused.text
        # a job whose callback fails once, then is delivered
        with Receiver([500, 200]) as receiver:
            body = {"file": base64.b64encode(documents.labelled_pdf(2, lines_per_page=0))
                    .decode(), "visualize": False, "callbackUrl": receiver.url}
            answer = requests.post(f"{gateway}/jobs", json=body, timeout=60)
            assert answer.status_code == 202, answer.text
            wait_until(lambda: len(receiver.requests) >= 2, 60, what="callback delivered")
        wait_until(lambda: "ocr_gateway_retries_total" in
                   requests.get(f"{gateway}/metrics", timeout=5).text, 30,
                   what="a retry away from the dropping replica")
        yield {"gateway": gateway, "workers": workers, "logs": logs}
    finally:
        stop_all(processes)
        dropping.close()


# ---- a real scrape by Debian's Prometheus --------------------------------------------------
def query(base: str, expr: str) -> list[dict]:
    answer = requests.get(f"{base}/api/v1/query", params={"query": expr}, timeout=5).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def value(base: str, expr: str) -> float | None:
    result = query(base, expr)
    return float(result[0]["value"][1]) if result else None


def test_prometheus_scrapes_the_fleet_and_answers_pages_per_second_and_queue_depth(
        fleet, tmp_path):
    port = free_port()
    target = lambda url: url.removeprefix("http://")  # noqa: E731
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "ocr-gateway", "static_configs": [
                {"targets": [target(fleet["gateway"])]}]},
            {"job_name": "ocr-worker", "static_configs": [
                {"targets": [target(u) for u in fleet["workers"]]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = ManagedProcess("prometheus", [
        tool("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h", "--log.level=warn"],
        ready_url=f"http://127.0.0.1:{port}/-/ready", log_path=tmp_path / "prometheus.log")
    base = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    sent = []

    def load():  # bounded: at most 12 documents, one after another
        while not stop.is_set() and len(sent) < 12:
            answer = requests.post(f"{fleet['gateway']}/ocr", json={"file": pdf(4)}, timeout=60)
            sent.append(answer.status_code)

    loader = threading.Thread(target=load, daemon=True)
    try:
        prometheus.start().wait_ready(60)
        wait_until(lambda: len(query(base, "up == 1")) == 3, 30, what="3 targets up")
        loader.start()
        pages = wait_until(lambda: (v := value(base, "sum(rate(ocr_worker_pages_total[10s]))"))
                           and v > 0 and v, 60, interval=0.5, what="pages/s above 0")
        depth = wait_until(
            lambda: (v := value(base, "max_over_time(sum(ocr_gateway_queued_pages)[30s:1s])"))
            and v > 0 and v, 60, interval=0.5, what="queue depth above 0")
        assert value(base, "sum(ocr_worker_queue_depth)") is not None
        # the rules run in this Prometheus too
        recorded = wait_until(lambda: value(base, "ocrfleet:pages_per_second:rate5m"), 30,
                              interval=0.5, what="the pages/s recording rule")
        assert pages > 0 and depth > 0 and recorded > 0
        rules = requests.get(f"{base}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {g["name"] for g in rules} == {"ocrfleet.recording", "ocrfleet.alerts"}
        assert [r for g in rules for r in g["rules"] if r["health"] == "err"] == []
    finally:
        stop.set()
        if loader.is_alive():
            loader.join(60)
        prometheus.stop()
    assert sent and set(sent) <= {200, 429}, sent
