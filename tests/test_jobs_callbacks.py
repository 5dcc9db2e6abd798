"""Job callbacks: the signature a receiver can verify (and a tampered or stale one it
refuses), the address rules (no private, loopback, link-local or metadata addresses unless
the operator allows them), and one delivery attempt against a receiver on loopback."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gateway.jobs.callbacks import (SIGNATURE_HEADER, CallbackSender, callback_client,
                                    check_callback_url, sign, verify_signature)
from services.ocr_api.errors import ApiError
from services.ocr_api.url_input import SafeHttpClient, loopback_allowed_for_tests

SECRET = "s3cret-for-tests-only-0123456789"


def loopback_client(timeout_s: float = 5) -> SafeHttpClient:
    """The production client with the tests' policy: loopback allowed, the rest as ever."""
    return SafeHttpClient(timeout_s, 0, max_redirects=0, policy=loopback_allowed_for_tests)


def test_signature_verifies_and_refuses_tampering_and_replays():
    body = b'{"jobId":"abc","state":"succeeded"}'
    header = sign(SECRET, body, timestamp=1_700_000_000)
    assert header.startswith("t=1700000000,v1=") and len(header.split("v1=")[1]) == 64
    assert verify_signature(SECRET, header, body, now=1_700_000_010)
    assert not verify_signature(SECRET, header, body + b" ", now=1_700_000_010)
    assert not verify_signature("another-secret-0123456789", header, body, now=1_700_000_010)
    assert not verify_signature(SECRET, header, body, now=1_700_000_000 + 301)  # too old
    assert not verify_signature(SECRET, "garbage", body)
    assert not verify_signature(SECRET, header.replace("t=1700000000", "t=1700000001"), body,
                                now=1_700_000_010)


@pytest.mark.parametrize("v1", ["é" * 64, "\udcff", "ü", ""])
def test_a_non_ascii_signature_is_false_not_an_exception(v1):
    assert verify_signature(SECRET, f"t=1700000000,v1={v1}", b"{}", now=1_700_000_000) is False


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8080/hook", "http://localhost:8080/hook", "http://10.1.2.3/",
    "http://169.254.169.254/latest/meta-data/", "http://[::1]:8080/",
    "http://[64:ff9b::7f00:1]:8080/",  # NAT64 of 127.0.0.1
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of the metadata address
    "http://[2002:7f00:1::1]:8080/",  # 6to4 of 127.0.0.1
    "http://[::7f00:1]:8080/",  # IPv4-compatible 127.0.0.1
    "http://[::ffff:10.0.0.1]/"])
def test_callback_urls_in_disguise_are_refused_as_url_input_refuses_them(url):
    with pytest.raises(ApiError) as exc:
        check_callback_url(url, callback_client(5, allow_private=False))
    assert exc.value.status == 422 and "callbackUrl refused" in exc.value.message


@pytest.mark.parametrize("url", ["ftp://example.com/x", "http://", "file:///etc/passwd",
                                 "https://user:pw@example.com/", 42, "http://x:99999/",
                                 "https://" + "a" * 3000 + ".com/"])
def test_bad_callback_urls_are_a_422(url):
    with pytest.raises(ApiError) as exc:
        check_callback_url(url, callback_client(5, allow_private=True))
    assert exc.value.status == 422 and "callbackUrl" in exc.value.message


def test_the_operators_opt_in_allows_private_receivers_but_not_unspecified_ones():
    client = callback_client(5, allow_private=True)
    assert check_callback_url("http://127.0.0.1:8080/hook", client)
    assert check_callback_url("http://10.1.2.3/hook", client)
    with pytest.raises(ApiError):
        check_callback_url("http://0.0.0.0:8080/hook", client)


class Receiver:
    """A callback receiver on loopback answering the statuses given, in turn."""

    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.requests: list[tuple[dict, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "http://169.254.169.254/")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook?x=1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_one_attempt_posts_a_signed_body_and_reports_the_status():
    sender = CallbackSender(SECRET, loopback_client())
    body = json.dumps({"jobId": "j1", "state": "succeeded"}).encode()
    with Receiver([500, 302, 204]) as receiver:
        assert sender.send(receiver.url, body, "j1").detail == "HTTP 500"
        redirected = sender.send(receiver.url, body, "j1")
        assert not redirected.delivered and redirected.detail == "HTTP 302"  # not followed
        assert sender.send(receiver.url, body, "j1").delivered
    assert len(receiver.requests) == 3
    for headers, received in receiver.requests:
        assert received == body
        assert headers["Content-Type"] == "application/json"
        assert headers["X-OCRFleet-Job-Id"] == "j1"
        assert headers["Host"] == receiver.url.split("/")[2]
        assert headers["Accept-Encoding"] == "identity"
        assert verify_signature(SECRET, headers[SIGNATURE_HEADER], received)


def test_the_default_policy_refuses_to_send_to_loopback():
    sender = CallbackSender(SECRET, callback_client(5, allow_private=False))
    with Receiver([200]) as receiver:
        delivery = sender.send(receiver.url, b"{}", "j1")
    assert not delivery.delivered and delivery.detail.startswith("refused")
    assert receiver.requests == []


def test_an_unreachable_receiver_is_a_failed_attempt():
    from scripts.fleet import free_port

    sender = CallbackSender(SECRET, loopback_client(2))
    delivery = sender.send(f"http://127.0.0.1:{free_port()}/", b"{}", "j1")
    assert not delivery.delivered and delivery.detail.startswith("refused")


class Dripper:
    """A receiver that answers one byte at a time, a byte every `every_s`: its status line
    and headers (`head=True`), or a complete head and then an endless gzip body."""

    def __init__(self, head: bool, every_s: float = 1.0):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.head, self.every_s = head, every_s
        self.stop = threading.Event()
        self.finished = 0  # answers it sent to the end
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn):
        try:
            conn.recv(65536)
            if self.head:
                data = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                             b"Content-Length: 1000000000\r\n\r\n")
                data = b"\x1f" * 10_000
            for byte in data:
                if self.stop.wait(self.every_s):
                    return
                conn.send(bytes([byte]))
            self.finished += 1
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()


def test_a_receiver_that_drips_its_answer_is_cut_off_at_the_attempts_deadline():
    dripper = Dripper(head=True, every_s=0.5)
    try:
        delivery = CallbackSender(SECRET, loopback_client(timeout_s=1.5)).send(
            dripper.url, b"{}", "j1")
        assert not delivery.delivered and "deadline" in delivery.detail
        assert dripper.finished == 0  # it had thousands of bytes to go
    finally:
        dripper.close()


def test_an_answers_body_is_neither_read_nor_decompressed():
    dripper = Dripper(head=False, every_s=0.5)
    try:
        delivery = CallbackSender(SECRET, loopback_client(timeout_s=30)).send(
            dripper.url, b"{}", "j1")
        assert delivery.delivered and delivery.detail == "HTTP 200"
    finally:
        dripper.close()
