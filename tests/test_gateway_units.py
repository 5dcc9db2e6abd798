"""The gateway's pure parts without a server: PDF splitting, reassembly, replica selection,
ejection and DNS discovery (with an injected resolver and clock), configuration."""

import time

import pypdfium2 as pdfium
import pytest

from gateway import assemble
from gateway.config import GatewayConfig
from gateway.outcome import Attempt, Outcome
from gateway.outputs import paddlex
from gateway.split import PdfCutter, group_pages
from gateway.flow import DnsReplicas, ListedReplicas, NoReplicas
from samples import documents
from services.ocr_api.settings import ConfigError


def test_group_pages_makes_consecutive_runs():
    assert group_pages([0, 1, 2, 3, 4], 2) == [(0, 1), (2, 3), (4,)]
    assert group_pages([0, 2, 3, 7], 3) == [(0,), (2, 3), (7,)]
    assert group_pages([5], 1) == [(5,)]


def test_split_pdf_keeps_each_page_and_its_size():
    pdf = documents.labelled_pdf(5, lines_per_page=0)
    cutter = PdfCutter(pdf)
    chunks = [cutter.cut(group) for group in group_pages([0, 2, 3, 4], 2)]
    cutter.close()
    assert [c.page_indices for c in chunks] == [(0,), (2, 3), (4,)]
    original = pdfium.PdfDocument(pdf)
    for chunk in chunks:
        part = pdfium.PdfDocument(chunk.data)
        assert len(part) == len(chunk.page_indices)
        for offset, index in enumerate(chunk.page_indices):
            assert part[offset].get_size() == original[index].get_size()
            text = part[offset].get_textpage().get_text_range()
            assert documents.has_page_label(text, index + 1, 5)


def reply(texts, sizes):
    return {"result": {"ocrResults": [{"prunedResult": {"rec_texts": [t]}} for t in texts],
                       "dataInfo": {"type": "pdf", "numPages": len(sizes),
                                    "pages": [{"width": w, "height": h} for w, h in sizes]}}}


def test_reassembly_orders_pages_and_builds_data_info():
    pages = (assemble.pages_from_reply(reply(["a"], [(10, 20)]), (0,), "pdf")
             + assemble.pages_from_reply(reply(["b", "c"], [(11, 21), (12, 22)]), (1, 2), "pdf"))
    result = paddlex.document_result(pages, page_range_given=False)
    assert [r["prunedResult"]["rec_texts"][0] for r in result["ocrResults"]] == ["a", "b", "c"]
    assert result["dataInfo"] == {"numPages": 3, "type": "pdf", "pages": [
        {"width": 10, "height": 20}, {"width": 11, "height": 21}, {"width": 12, "height": 22}]}
    assert "failedPages" not in result


def test_a_reply_with_the_wrong_page_count_is_rejected():
    with pytest.raises(assemble.MalformedReply):
        assemble.pages_from_reply(reply(["a"], [(1, 1)]), (0, 1), "pdf")


def test_partial_results_name_the_failed_pages():
    pages = (assemble.pages_from_reply(reply(["a"], [(10, 20)]), (0,), "pdf")
             + assemble.failed_pages((1,), 502, "replica gone", "pdf"))
    result = paddlex.document_result(pages, page_range_given=True)
    assert result["ocrResults"][1]["prunedResult"] is None
    assert result["ocrResults"][1]["error"] == {"errorCode": 502, "errorMsg": "replica gone"}
    assert result["failedPages"] == [{"pageIndex": 1, "errorCode": 502,
                                      "errorMsg": "replica gone"}]
    assert result["dataInfo"]["pageIndices"] == [0, 1]
    status, message = paddlex.describe_failures(pages)
    assert status == 502 and "Page(s) 2 " in message


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def replica_set(urls, **kwargs):
    return ListedReplicas(urls=urls, probe=lambda url, headers: (True, {}),
                      **kwargs)


def answer(outcome):
    return Attempt(outcome, None, {}, "")


def test_least_outstanding_wins_and_ties_rotate():
    replicas = replica_set(["http://a", "http://b", "http://c"])
    first = replicas.acquire()
    second = replicas.acquire()
    third = replicas.acquire()
    assert {first.url, second.url, third.url} == {"http://a", "http://b", "http://c"}
    replicas.release(second, answer(Outcome.OK))
    assert replicas.acquire().url == second.url  # the only one with nothing outstanding


def test_in_a_full_fleet_a_page_finds_the_one_replica_with_room_and_then_none():
    """Of 128 replicas that each hold their target, the one a page came back from gets the
    next, and with none left `acquire` says so (the ranked replicas with room follow every
    answer)."""
    clock = Clock()
    urls = [f"http://w{i}" for i in range(128)]
    replicas = replica_set(urls, clock=clock)
    replicas.set_demand(1000)
    placed = []
    while (replica := replicas.acquire()) is not None:
        placed.append(replica)
    assert len(placed) == 2 * 128 and not replicas.look().documents  # two each (the default target)
    back = placed[77]
    replicas.release(back, answer(Outcome.OK))
    assert replicas.look().documents
    assert replicas.acquire() is back
    assert replicas.acquire() is None


def test_a_paused_replica_gets_room_back_when_its_pause_ends():
    clock = Clock()
    replicas = replica_set(["http://a"], clock=clock)
    replica = replicas.acquire()
    replicas.release(replica, Attempt(Outcome.BUSY, 503, {}, "busy", retry_after_s=0.2))
    assert not replicas.look().documents
    when = replicas.look().next_change
    assert when is not None and 0 < when - clock.now <= 0.2
    clock.now = when
    assert replicas.look().documents and replicas.acquire() is replica


def test_a_page_avoids_replicas_it_already_failed_on():
    replicas = replica_set(["http://a", "http://b"])
    chosen = replicas.acquire(exclude={"http://a"})
    assert chosen.url == "http://b"
    replicas.release(chosen, answer(Outcome.OK))
    # with every replica excluded it still gets one rather than failing
    assert replicas.acquire(exclude={"http://a", "http://b"}).url in ("http://a", "http://b")


def test_a_replica_that_goes_down_is_ejected_for_a_while():
    clock = Clock()
    replicas = replica_set(["http://a", "http://b"], eject_s=10, clock=clock)
    down = replicas.acquire()
    replicas.release(down, answer(Outcome.DOWN))
    picks = set()
    for _ in range(4):
        replica = replicas.acquire()
        picks.add(replica.url)
        replicas.release(replica, answer(Outcome.OK))
    assert picks == {"http://a", "http://b"} - {down.url}
    clock.now += 11
    assert down.eligible(clock.now)


def test_all_ejected_waits_for_the_one_back_soonest():
    clock = Clock()
    replicas = replica_set(["http://a", "http://b"], eject_s=10, clock=clock)
    a, b = replicas.acquire(), replicas.acquire()
    replicas.release(a, answer(Outcome.DOWN))
    clock.now += 5
    replicas.release(b, answer(Outcome.DOWN))
    assert replicas.acquire() is None  # pages wait in the gateway's queue
    assert replicas.look().next_change == pytest.approx(clock.now + 5)
    clock.now += 5
    assert replicas.acquire().url == a.url


def test_processes_that_probed_the_same_list_send_their_first_pages_to_different_workers():
    """Among idle workers a page goes to the one heard from last. Gateway processes that
    probed the same list in its order would send their first pages to the same workers (two
    or more at each, while others idled for a page time): each probes in an order of its
    own."""
    clock = Clock()
    urls = [f"http://w{i}" for i in range(64)]
    first_pages = []
    for _ in range(2):  # two gateway processes
        def probe(url, headers):
            clock.now += 0.001  # one after the other
            return True, {"X-Ocr-Capacity": "2", "X-Ocr-Free": "2"}
        replicas = ListedReplicas(urls=urls, clock=clock, probe=probe)
        replicas.probe_all()
        first_pages.append({replicas.acquire().url for _ in range(16)})
    assert len(first_pages[0] & first_pages[1]) < 16  # the same 16 workers: 1 in 5e14


def test_dns_discovery_adds_and_removes_replicas():
    answers = {"addresses": ["http://10.0.0.1:8101"]}
    probed = []
    replicas = DnsReplicas(dns="ocr-worker-headless:8101",
                          probe=lambda url, headers: (probed.append(url) or True, {}),
                          resolver=lambda host, port: answers["addresses"])
    replicas.refresh()
    replicas.probe_all()
    assert [r.url for r in replicas.replicas()] == ["http://10.0.0.1:8101"]
    busy = replicas.acquire()
    answers["addresses"] = ["http://10.0.0.2:8101"]
    replicas.refresh()
    replicas.probe_all()
    assert [r.url for r in replicas.replicas()] == ["http://10.0.0.2:8101"]
    assert replicas.acquire().url == "http://10.0.0.2:8101"
    replicas.release(busy, answer(Outcome.OK))  # the vanished replica's last page still completes
    answers["addresses"] = []
    replicas.refresh()
    with pytest.raises(NoReplicas):
        replicas.acquire()


def test_config_needs_exactly_one_upstream_mode():
    with pytest.raises(ConfigError):
        GatewayConfig.from_env({})
    with pytest.raises(ConfigError):
        GatewayConfig.from_env({"GATEWAY_REPLICAS": "http://a", "GATEWAY_UPSTREAM_URL": "http://b"})
    with pytest.raises(ConfigError):
        GatewayConfig.from_env({"GATEWAY_REPLICA_DNS": "no-port"})
    config = GatewayConfig.from_env({"GATEWAY_REPLICAS": "http://a:1/, http://b:2",
                                     "GATEWAY_PAGES_PER_CHUNK": "2"})
    assert config.replicas == ("http://a:1", "http://b:2") and config.pages_per_chunk == 2


def test_the_gateway_imports_and_serves_without_the_engine_stack():
    """The gateway image has no paddleocr, paddlex, onnxruntime, OpenCV or numpy (it has
    pypdfium2 and Pillow, to cut PDFs and TIFFs): importing and building the app must not
    need them."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    code = (
        "import sys\n"
        "for name in ('paddleocr', 'paddlex', 'onnxruntime', 'cv2', 'numpy', "
        "'services.ocr_worker'):\n"
        "    sys.modules[name] = None  # any import of these now fails\n"
        "from gateway.app import create_app\n"
        "from gateway.config import GatewayConfig\n"
        "app = create_app(GatewayConfig(replicas=('http://127.0.0.1:9',)), start=False)\n"
        "client = app.test_client()\n"
        "assert client.get('/healthz').status_code == 200\n"
        "assert client.post('/ocr', json={'file': 'QUJD'}).status_code == 422\n"
        "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_an_image_asking_to_start_soon_goes_on_a_connection_of_its_own():
    """Behind a k8s Service (kube-proxy balances connections, not requests) a try on the
    pooled connection would meet the refusing pod again: behind one URL, each try that asks
    to start soon says `Connection: close`, so the connection it went on is not used again
    and the next try opens its own; pages keep reusing the pool's. The refusal is
    Outcome.LATER. The stand-in worker answers `Connection: close` to it, as gunicorn and
    nginx do (without it the client may take the closing connection back into its pool)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gateway.connections import Connections
    from gateway.dispatch import DispatchSettings, ReplicaClient
    from gateway.flow.share import FleetView
    from gateway.flow import Replica

    seen = []

    class Worker(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.client_address[1], self.headers.get("X-Ocr-Start-Within-Ms")))
            late = self.headers.get("X-Ocr-Start-Within-Ms") is not None
            body = b'{"errorCode": 503, "errorMsg": "later"}' if late else b'{"result": {}}'
            self.send_response(503 if late else 200)
            if late:
                self.send_header("X-Ocr-Starts-In-Ms", "1500")
            if self.headers.get("Connection", "").lower() == "close":
                self.send_header("Connection", "close")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Worker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ReplicaClient(Connections(4), DispatchSettings(5.0, 2.0, balanced=True),
                               FleetView())
        replica = Replica(f"http://127.0.0.1:{server.server_port}")
        post = lambda **kw: client.post(replica, b"{}", log_id="t",  # noqa: E731
                                        deadline=time.monotonic() + 10, **kw)
        outcomes = [post().outcome, post().outcome,
                    post(first=True, start_within_s=0.25).outcome,
                    post(first=True, start_within_s=0.25).outcome, post().outcome]
        assert outcomes == [Outcome.OK] * 2 + [Outcome.LATER] * 2 + [Outcome.OK]
        ports = [port for port, _ in seen]
        assert ports[0] == ports[1]  # pages: one pooled connection
        assert len(set(ports[2:])) == 3  # none is used again after a try that asked
        assert [within for _, within in seen] == [None, None, "250", "250", None]
    finally:
        server.shutdown()
        server.server_close()
