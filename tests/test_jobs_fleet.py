"""Async jobs across real gateway processes, a real redis-server and sim-engine workers, all
on loopback. A counting proxy in front of the workers records which page each worker request
carried (page i of a test PDF is `base + i` points wide), so "every page once" is counted
where the work happens, not inferred from the result.

- A 40-page job survives SIGKILL of the gateway running it: another gateway (one already
  running, or one started afterwards) resumes it; the result has every page once, in order;
  no page stored before the kill was sent again. Once on Redis, once on the embedded SQLite
  store (gunicorn's 2 processes sharing the file).
- Cancellation stops the pages; limits answer 429; long-poll; callbacks are signed, retried
  after a 500 and delivered once; results expire."""

from __future__ import annotations

import base64
import functools
import io
import itertools
import json
import os
import re
import signal
import threading
import zipfile
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pypdfium2 as pdfium
from PIL import Image
import pytest
import requests

from gateway.jobs.callbacks import SIGNATURE_HEADER, verify_signature
from gateway.jobs.store_redis import RedisJobStore
from gateway.jobs.store_sqlite import SqliteJobStore
from scripts.fleet import (free_port, gateway_process, http_status, redis_process, stop_all,
                           worker_process)
from tests import conftest
from tests.test_jobs_callbacks import Receiver

pytestmark = pytest.mark.slow  # starts servers: scheduled first (tests/conftest.py)

SECRET = "fleet-test-secret-0123456789abcdef"
PAGES = 40
wait_until = functools.partial(conftest.wait_until, timeout=60.0)
SIM = {"OCR_ENGINE": "sim", "OCR_VISUALIZE": "false", "OCR_SIM_PAGE_MS": "100"}


def sized_tiff(frames: int, base: int) -> bytes:
    """Frame i is `base + i` pixels wide, as page i of sized_pdf is points wide."""
    images = [Image.new("L", (base + index, 100), 255) for index in range(frames)]
    buffer = io.BytesIO()
    images[0].save(buffer, format="TIFF", save_all=True, append_images=images[1:])
    return buffer.getvalue()


def sized_pdf(pages: int, base: int) -> bytes:
    pdf = pdfium.PdfDocument.new()
    for index in range(pages):
        pdf.new_page(base + index, 100)
    buffer = io.BytesIO()
    pdf.save(buffer)
    return buffer.getvalue()


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a gateway killed mid-request resets its connection: expected here


class CountingProxy:
    """Forwards to the workers in turn; counts, per page width, the requests a worker
    answered with 200 (a 503 "busy" is not work done)."""

    def __init__(self, worker_urls):
        self.counts: Counter[int] = Counter()
        self.inflight = 0
        self.lock = threading.Lock()
        workers = itertools.cycle(worker_urls)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self, body=None):
                with proxy.lock:
                    target = next(workers)
                    proxy.inflight += 1
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() in ("content-type", "x-log-id")}
                    answer = requests.request(self.command, target + self.path, data=body,
                                              headers=headers, timeout=120)
                finally:
                    with proxy.lock:
                        proxy.inflight -= 1
                return answer

            def do_GET(self):
                self._reply(self._forward())

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                answer = self._forward(body)
                if answer.status_code == 200:
                    width = proxy.page_width(body)
                    with proxy.lock:
                        proxy.counts[width] += 1
                self._reply(answer)

            def _reply(self, answer):
                self.send_response(answer.status_code)
                for name in ("Content-Type", "Retry-After"):
                    if name in answer.headers:
                        self.send_header(name, answer.headers[name])
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *args):
                pass

        self.server = QuietServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def page_width(self, body: bytes) -> int:
        """The width of the page (a one-page PDF) or frame (a TIFF) a request carried."""
        data = base64.b64decode(json.loads(body)["file"])
        if data[:4] in (b"II*\x00", b"MM\x00*"):
            with Image.open(io.BytesIO(data)) as frame:
                return frame.width
        with self.lock:
            pdf = pdfium.PdfDocument(data)
            width = round(pdf[0].get_size()[0])
            pdf.close()
        return width

    def sent(self, base: int) -> list[int]:
        """Worker requests per page of the document whose page 0 is `base` points wide."""
        with self.lock:
            return [self.counts[base + index] for index in range(PAGES)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    logs = tmp_path_factory.mktemp("jobs-fleet")
    redis_port = free_port()
    processes = [redis_process(redis_port, logs / "redis", logs / "redis.log").start()]
    ports = [free_port(), free_port()]
    processes += [worker_process(port, SIM, logs / f"worker-{port}.log").start()
                  for port in ports]
    proxy = None
    try:
        for process in processes:
            process.wait_ready(120)
        proxy = CountingProxy([f"http://127.0.0.1:{port}" for port in ports])
        yield {"redis_url": f"redis://127.0.0.1:{redis_port}/0", "proxy": proxy,
               "logs": logs}
    finally:
        if proxy is not None:
            proxy.close()
        stop_all(processes)


def gateway_env(fleet, **extra) -> dict[str, str]:
    return {"GATEWAY_REPLICAS": fleet["proxy"].url, "GATEWAY_PROCESSES": "1",
            "GATEWAY_REPLICA_TARGET": "2", "GATEWAY_JOBS_LEASE_S": "2",
            "GATEWAY_JOBS_CALLBACK_SECRET": SECRET,
            "GATEWAY_JOBS_CALLBACK_ALLOW_PRIVATE": "true",
            "GATEWAY_JOBS_CALLBACK_BACKOFF_S": "0.2", **extra}


def start_gateway(fleet, env, name):
    port = free_port()
    process = gateway_process(port, env, fleet["logs"] / f"gateway-{name}-{port}.log")
    process.start().wait_ready(60)
    process.url = f"http://127.0.0.1:{port}"
    return process


def submit(url, pdf: bytes, headers=None, **fields):
    body = {"file": base64.b64encode(pdf).decode(), "visualize": False, **fields}
    return requests.post(f"{url}/jobs", json=body, headers=headers or {}, timeout=60)


def follow(url, job_id, headers=None) -> tuple[dict, int]:
    """Long-poll until the job ends: (its status, how many GETs it took)."""
    for calls in itertools.count(1):
        status = requests.get(f"{url}/jobs/{job_id}", params={"wait": 30}, headers=headers,
                              timeout=60).json()["result"]
        if status["state"] not in ("queued", "running"):
            return status, calls
        assert calls < 20, status


# Each of these two long tests may run on a pytest process of its own (with its own `fleet`)
# rather than after the others: see group_for_xdist in tests/conftest.py.
@pytest.mark.parametrize("store_kind", [
    pytest.param(kind, marks=pytest.mark.xdist_group(f"jobs-gateway-killed-{kind}"))
    for kind in ("redis", "sqlite")])
def test_a_job_survives_sigkill_of_its_gateway_every_page_once_in_order(
        fleet, tmp_path, store_kind):
    base = 100 if store_kind == "redis" else 200
    if store_kind == "redis":
        env = gateway_env(fleet, GATEWAY_REDIS_URL=fleet["redis_url"])
        store = RedisJobStore(fleet["redis_url"])
    else:  # one machine: the gateways share the file; the first runs 2 gunicorn processes
        env = gateway_env(fleet, GATEWAY_JOBS_DB=str(tmp_path / "jobs.sqlite3"))
        store = SqliteJobStore(env["GATEWAY_JOBS_DB"])
    gateways = [start_gateway(fleet, {**env, "GATEWAY_PROCESSES": "2"}, "a")]
    if store_kind == "redis":  # two replicas compete for the job from the start
        gateways.append(start_gateway(fleet, env, "b"))
    try:
        answer = submit(gateways[0].url, sized_pdf(PAGES, base))
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["result"]["jobId"]
        assert answer.headers["Location"].endswith(f"/jobs/{job_id}")

        running = wait_until(lambda: (job := store.get(job_id)) and job.pages_done >= 5
                             and job.lease_owner and job, what="5 pages done")
        runner_pid = int(running.lease_owner.rsplit(":", 1)[1])
        victim = next(g for g in gateways if os.getpgid(runner_pid) == g.pid)
        victim.signal_group(signal.SIGKILL)
        victim.process.wait(10)
        done_at_kill = store.done_indices(job_id)
        assert 5 <= len(done_at_kill) < PAGES, "kill the gateway mid-job"
        gateways.append(start_gateway(fleet, env, "c"))  # and a fresh one joins
        survivor = next(g for g in gateways if g.alive())

        status, _ = follow(survivor.url, job_id)
        assert status["state"] == "succeeded", status
        assert status["pagesDone"] == PAGES and status["pagesFailed"] == 0
        result = requests.get(f"{survivor.url}/jobs/{job_id}/result", timeout=60)
        assert result.status_code == 200
        pages = result.json()["result"]["ocrResults"]
        widths = [2 * (base + i) for i in range(PAGES)]  # rendered at 144 DPI
        assert [p["prunedResult"]["rec_texts"][0].split()[2] for p in pages] == \
            [f"{w}x200" for w in widths]
        assert [p["width"] for p in result.json()["result"]["dataInfo"]["pages"]] == widths

        sent = fleet["proxy"].sent(base)
        assert min(sent) >= 1, sent
        assert all(sent[i] == 1 for i in done_at_kill), (sorted(done_at_kill), sent)
        redone = [i for i, n in enumerate(sent) if n > 1]
        # only pages in flight at the kill: the proxy passes no fleet board, so the gateway
        # keeps GATEWAY_REPLICA_TARGET (2) pages on it
        assert max(sent) <= 2 and len(redone) <= 4, (redone, sent)
        print(f"\n{store_kind}: {len(done_at_kill)} pages done at the kill, "
              f"redone (in flight at the kill): {redone}")
    finally:
        stop_all(gateways)
        store.close()


@pytest.fixture(scope="module")
def gateway(fleet):
    env = gateway_env(fleet, GATEWAY_REDIS_URL=fleet["redis_url"],
                      GATEWAY_JOBS_MAX_ACTIVE="2", GATEWAY_JOBS_RESULT_TTL_S="8")
    process = start_gateway(fleet, env, "api")
    yield process
    process.stop()


def test_callback_is_signed_retried_after_a_500_and_delivered_once(fleet, gateway):
    key = {"X-API-Key": "callback-client"}
    with Receiver([500, 200]) as receiver:
        answer = submit(gateway.url, sized_pdf(3, 300), key, callbackUrl=receiver.url)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["result"]["jobId"]
        status, calls = follow(gateway.url, job_id, key)
        assert status["state"] == "succeeded" and calls <= 3  # long-poll, not busy polling
        delivered = wait_until(lambda: (s := requests.get(f"{gateway.url}/jobs/{job_id}",
                                                          headers=key, timeout=10)
                                        .json()["result"])["callback"]["state"] == "delivered"
                               and s, what="callback delivered")
        assert delivered["callback"]["attempts"] == 2
        assert len(receiver.requests) == 2
    bodies = [body for _, body in receiver.requests]
    assert bodies[0] == bodies[1]
    for headers, body in receiver.requests:
        assert verify_signature(SECRET, headers[SIGNATURE_HEADER], body)
    payload = json.loads(bodies[0])
    assert payload["jobId"] == job_id and payload["state"] == "succeeded"
    assert payload["resultUrl"] == f"{gateway.url}/jobs/{job_id}/result"
    assert payload["pagesDone"] == 3


# A reload (SIGHUP: gunicorn replaces its processes), a graceful stop (SIGTERM) or a kill
# (SIGKILL) of the gateway mid-job: the job ends succeeded only with every selected page
# stored once, a TIFF by frames like a PDF by pages, none done before the signal sent again.
@pytest.mark.parametrize("kind,sig", [
    pytest.param(kind, sig, marks=pytest.mark.xdist_group("jobs-gateway-signals"))
    for kind in ("tiff", "pdf") for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGKILL)],
    ids=lambda v: getattr(v, "name", v))
def test_a_job_is_whole_after_a_reload_stop_or_kill_of_its_gateway(fleet, tmp_path, kind,
                                                                   sig):
    # page widths no other test of the module uses (the proxy counts pages by width)
    base = {"tiff": 1000, "pdf": 1300}[kind] + {signal.SIGHUP: 0, signal.SIGTERM: 100,
                                                signal.SIGKILL: 200}[sig]
    env = gateway_env(fleet, GATEWAY_JOBS_DB=str(tmp_path / "jobs.sqlite3"))
    store = SqliteJobStore(env["GATEWAY_JOBS_DB"])
    gateways = [start_gateway(fleet, env, f"{kind}-{sig.name}")]
    try:
        document = sized_tiff(PAGES, base) if kind == "tiff" else sized_pdf(PAGES, base)
        answer = submit(gateways[0].url, document)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["result"]["jobId"]
        assert answer.json()["result"]["numPages"] == PAGES  # counted at submit
        wait_until(lambda: (job := store.get(job_id)) and job.pages_done >= 3,
                   what="3 pages done")
        if sig == signal.SIGHUP:  # to the master: it starts new processes, stops the old
            os.kill(gateways[0].pid, sig)
        else:
            gateways[0].signal_group(sig)
            gateways[0].process.wait(30)
        done_at_signal = store.done_indices(job_id)
        assert len(done_at_signal) < PAGES, "signal the gateway mid-job"
        if sig != signal.SIGHUP:
            gateways.append(start_gateway(fleet, env, f"{kind}-{sig.name}-next"))
        status, _ = follow(gateways[-1].url, job_id)
        assert status["state"] == "succeeded", status
        assert status["numPages"] == status["pagesDone"] == PAGES, status
        assert [p.index for p in store.pages(job_id)] == list(range(PAGES))
        result = requests.get(f"{gateways[-1].url}/jobs/{job_id}/result", timeout=60)
        texts = [p["prunedResult"]["rec_texts"][0].split()[2]
                 for p in result.json()["result"]["ocrResults"]]
        scale = 2 if kind == "pdf" else 1  # a PDF page is rendered at 144 DPI
        assert texts == [f"{scale * (base + i)}x{scale * 100}" for i in range(PAGES)]
        sent = fleet["proxy"].sent(base)
        assert min(sent) >= 1 and all(sent[i] == 1 for i in done_at_signal), sent
    finally:
        stop_all(gateways)
        store.close()


def test_cancel_stops_sending_pages_and_limits_answer_429(fleet, gateway):
    key = {"Authorization": "Bearer cancel-client"}
    first = submit(gateway.url, sized_pdf(PAGES, 400), key).json()["result"]
    second = submit(gateway.url, sized_pdf(2, 500), key)
    assert second.status_code == 202
    refused = submit(gateway.url, sized_pdf(2, 500), key)  # a third active job
    assert refused.status_code == 429 and refused.json()["errorCode"] == 429
    assert refused.headers["Retry-After"] and "unfinished job" in refused.json()["errorMsg"]
    other_client = submit(gateway.url, sized_pdf(2, 500), {"X-API-Key": "someone-else"})
    assert other_client.status_code == 202  # limits are per client

    job_url = f"{gateway.url}/jobs/{first['jobId']}"
    assert requests.get(job_url, timeout=10).status_code == 404  # not this client's job
    wait_until(lambda: requests.get(job_url, headers=key, timeout=10)
               .json()["result"]["pagesDone"] >= 2, what="2 pages done")
    early = requests.get(f"{job_url}/result", headers=key, timeout=10)
    assert early.status_code == 409 and "pages done" in early.json()["errorMsg"]
    so_far = requests.get(f"{job_url}/result", timeout=10,
                          headers={**key, "Accept": "application/x-ndjson"})
    lines = [json.loads(line) for line in so_far.text.splitlines()]
    assert lines[-1]["done"] is False and lines[-1]["state"] == "running"
    assert [line["pageIndex"] for line in lines[:-1]] == list(range(len(lines) - 1))

    cancelled = requests.delete(job_url, headers=key, timeout=10)
    assert cancelled.status_code == 200
    assert cancelled.json()["result"]["state"] == "cancelled"
    wait_until(lambda: fleet["proxy"].inflight == 0, what="pages in flight to come back")
    sent_after_cancel = sum(fleet["proxy"].sent(400))
    threading.Event().wait(1.5)  # a runner that kept going would send ~30 pages by now
    # at most the pages already handed to a sender (GATEWAY_REPLICA_TARGET: 2) still go out
    assert sent_after_cancel <= sum(fleet["proxy"].sent(400)) <= sent_after_cancel + 2 < PAGES
    assert requests.get(job_url, headers=key, timeout=10).json()["result"]["state"] == \
        "cancelled"
    assert requests.get(f"{job_url}/result", headers=key, timeout=10).status_code == 410
    assert submit(gateway.url, sized_pdf(2, 500), key).status_code == 202  # room again
    assert requests.delete(job_url, headers=key, timeout=10).status_code == 200  # deleted
    assert requests.get(job_url, headers=key, timeout=10).status_code == 404


def test_results_in_each_format_then_expiry(fleet, gateway):
    answer = submit(gateway.url, sized_pdf(3, 600), pageRange="2-3")
    job_id = answer.json()["result"]["jobId"]
    status, _ = follow(gateway.url, job_id)
    assert status["numPages"] == 2 and status["expiresAt"] and status["finishedAt"]
    result_url = f"{gateway.url}/jobs/{job_id}/result"
    body = requests.get(result_url, timeout=10).json()
    assert body["result"]["dataInfo"]["pageIndices"] == [1, 2]
    assert body["logId"] == answer.json()["logId"]
    lines = requests.get(result_url, headers={"Accept": "application/x-ndjson"},
                         timeout=10).text.splitlines()
    assert [json.loads(line).get("pageIndex") for line in lines] == [1, 2, None]
    assert json.loads(lines[-1])["done"] is True and json.loads(lines[-1])["errorCode"] == 0
    text = requests.get(result_url, headers={"Accept": "text/plain"}, timeout=10)
    assert text.headers["Content-Type"].startswith("text/plain")
    assert text.text.split("\f")[0].startswith("[simulated] page 1202x200")
    # the same text /ocr answers for the same pages: one writer of answers
    ocr = requests.post(f"{gateway.url}/ocr", headers={"Accept": "text/plain"}, timeout=60,
                        json={"file": base64.b64encode(sized_pdf(3, 600)).decode(),
                              "pageRange": "2-3", "visualize": False})
    assert ocr.status_code == 200 and ocr.text == text.text
    pdf = requests.get(result_url, headers={"Accept": "application/pdf"}, timeout=30)
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")
    assert pdf.headers["X-Ocr-Pages"] == "2"
    bundle = requests.get(result_url, headers={"Accept": "application/zip"}, timeout=30)
    assert bundle.status_code == 200, bundle.text[:300]
    with zipfile.ZipFile(io.BytesIO(bundle.content)) as archive:
        assert sorted(archive.namelist()) == ["result.alto.xml", "result.hocr", "result.json",
                                              "searchable.pdf", "text.txt"]
        assert archive.read("text.txt").decode() == text.text
        assert json.loads(archive.read("result.json"))["result"]["dataInfo"] == \
            body["result"]["dataInfo"]
    assert requests.get(result_url, headers={"Accept": "image/png"},
                        timeout=10).status_code == 406

    wait_until(lambda: requests.get(f"{gateway.url}/jobs/{job_id}", timeout=10).status_code
               == 404, timeout=30, what="the result to expire")
    store = RedisJobStore(fleet["redis_url"])
    try:  # purged from Redis too, not only hidden
        wait_until(lambda: not store.redis.exists(store._key("job", job_id))
                   and store.document(job_id) is None, timeout=30, what="purge")
    finally:
        store.close()


def test_bad_submissions_are_refused_at_once(gateway):
    cases = [({"file": "###"}, 422), ({"file": base64.b64encode(b"%PDF-1.7 x").decode()}, 422),
             ({"file": base64.b64encode(sized_pdf(2, 700)).decode(), "pageRange": "5"}, 422),
             ({"file": base64.b64encode(sized_pdf(1, 700)).decode(),
               "callbackUrl": "ftp://example.com/x"}, 422)]
    for body, status in cases:
        answer = requests.post(f"{gateway.url}/jobs", json=body, timeout=10)
        assert answer.status_code == status and answer.json()["errorCode"] == status, \
            answer.text
    assert requests.post(f"{gateway.url}/jobs", data=b"nope", timeout=10).status_code == 400
    unknown = requests.get(f"{gateway.url}/jobs/{'0' * 32}", timeout=10)
    assert unknown.status_code == 404 and unknown.json()["errorCode"] == 404
    assert requests.get(f"{gateway.url}/jobs/x?wait=abc", timeout=10).status_code == 404
    upload = requests.post(f"{gateway.url}/jobs", files={"file": sized_pdf(1, 700)},
                           data={"visualize": "false"}, timeout=10)
    assert upload.status_code == 202  # multipart, as /ocr
    bad_wait = requests.get(f"{gateway.url}/jobs/{upload.json()['result']['jobId']}",
                            params={"wait": "soon"}, timeout=10)
    assert bad_wait.status_code == 422
    status, _ = follow(gateway.url, upload.json()["result"]["jobId"])
    assert status["state"] == "succeeded", status
    metrics = requests.get(f"{gateway.url}/metrics", timeout=10).text
    assert re.search(r'^ocr_gateway_jobs_total\{state="succeeded"\} [1-9]', metrics, re.M)


def test_make_run_redis_starts_redis_and_the_gateway_stores_jobs_there(tmp_path):
    from tests.test_run_fleet import launch

    worker, gateway_port, redis_port = free_port(), free_port(), free_port()
    process = launch(tmp_path, "--workers", "1", "--worker-port", str(worker), "--no-nginx",
                     "--gateway-port", str(gateway_port), "--redis",
                     "--redis-port", str(redis_port))
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        wait_until(lambda: process.poll() is not None
                   or (_listening(gateway_port) and http_status(f"{url}/readyz") == 200),
                   timeout=120, what="make run --redis to be ready")
        assert process.poll() is None, process.stdout.read()
        job_id = submit(url, sized_pdf(2, 800)).json()["result"]["jobId"]
        assert follow(url, job_id)[0]["state"] == "succeeded"
        store = RedisJobStore(f"redis://127.0.0.1:{redis_port}/0")
        try:
            assert store.get(job_id).pages_done == 2
        finally:
            store.close()
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert f"redis-server on 127.0.0.1:{redis_port}" in output
    assert not _listening(redis_port), "make run stops its redis-server"


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
