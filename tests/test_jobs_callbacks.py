"""Job callbacks: the signature a receiver can verify (and a tampered or stale one it
refuses), the address rules (no private, loopback, link-local or metadata addresses unless
the operator allows them), and one delivery attempt against a receiver on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gateway.jobs.callbacks import (SIGNATURE_HEADER, CallbackRefused, CallbackSender,
                                    any_address, backoff_s, check_callback_url, parse_url,
                                    public_addresses, sign, verify_signature)
from services.ocr_api.errors import ApiError

SECRET = "s3cret-for-tests-only-0123456789"


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


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1",
                                     "169.254.169.254", "100.64.0.1", "0.0.0.0", "::1",
                                     "fe80::1", "fd00::1", "::ffff:127.0.0.1", "224.0.0.1"])
def test_non_public_addresses_are_refused(address):
    with pytest.raises(CallbackRefused):
        public_addresses(address, 443)
    assert any_address(address, 443)  # the operator's opt-in allows them


def test_public_addresses_are_allowed():
    assert public_addresses("8.8.8.8", 443) == ["8.8.8.8"]
    assert public_addresses("2001:4860:4860::8888", 443) == ["2001:4860:4860::8888"]


@pytest.mark.parametrize("url", ["ftp://example.com/x", "http://", "file:///etc/passwd",
                                 "https://user:pw@example.com/", 42, "http://x:99999/",
                                 "https://" + "a" * 3000 + ".com/"])
def test_bad_callback_urls_are_a_422(url):
    with pytest.raises(ApiError) as exc:
        check_callback_url(url, any_address)
    assert exc.value.status == 422 and "callbackUrl" in exc.value.message


def test_loopback_callback_is_a_422_by_default():
    with pytest.raises(ApiError) as exc:
        check_callback_url("http://localhost:8080/hook", public_addresses)
    assert exc.value.status == 422 and "not a public address" in exc.value.message


def test_parse_url_keeps_path_and_query():
    target = parse_url("https://hooks.example.com/ocr/done?token=1")
    assert (target.host, target.port, target.path) == ("hooks.example.com", 443,
                                                       "/ocr/done?token=1")


def test_backoff_doubles_up_to_a_cap():
    assert [backoff_s(2, n) for n in (1, 2, 3, 4)] == [2, 4, 8, 16]
    assert backoff_s(2, 30) == 600


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
    sender = CallbackSender(SECRET, any_address, timeout_s=5)
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
        assert verify_signature(SECRET, headers[SIGNATURE_HEADER], received)


def test_the_default_policy_refuses_to_send_to_loopback():
    sender = CallbackSender(SECRET, public_addresses, timeout_s=5)
    with Receiver([200]) as receiver:
        delivery = sender.send(receiver.url, b"{}", "j1")
    assert not delivery.delivered and delivery.detail.startswith("refused")
    assert receiver.requests == []


def test_an_unreachable_receiver_is_a_failed_attempt():
    from scripts.fleet import free_port

    sender = CallbackSender(SECRET, any_address, timeout_s=2)
    delivery = sender.send(f"http://127.0.0.1:{free_port()}/", b"{}", "j1")
    assert not delivery.delivered and "Error" in delivery.detail
