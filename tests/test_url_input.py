"""URL input without server-side request forgery: the address policy (pure), URL checks, and
fetches against a local HTTP server on 127.0.0.1. Only a test can allow loopback (it passes
`loopback_allowed_for_tests` and a fixed resolver); no DNS lookups, no traffic off loopback:
addresses the policy refuses are never connected to, and the tests check that."""

import ipaddress
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from services.ocr_api.errors import ApiError
from services.ocr_api.url_input import (MAX_REDIRECTS, FetchTooLarge, SafeHttpClient,
                                        UrlRefused, blocked_reason, check_public_url,
                                        loopback_allowed_for_tests, make_url_fetcher,
                                        private_allowed, split_url)


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
    "169.254.169.254", "169.254.0.1", "100.64.0.1", "100.127.255.254", "0.0.0.0", "0.1.2.3",
    "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255", "192.0.2.1",
    "198.18.0.1", "::", "::1", "fe80::1", "fe80::1%eth0", "fc00::1", "fd12:3456::1",
    "ff02::1", "fec0::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254",
    "::127.0.0.1", "::a00:1", "64:ff9b::10.0.0.1", "64:ff9b::127.0.0.1",
    "64:ff9b::169.254.169.254", "64:ff9b:1::1", "2002:a00:1::1", "2002:7f00:1::",
    "2001:db8::1", "2001::1", "100::1",
])
def test_non_public_addresses_are_refused(address):
    assert blocked_reason(address) is not None


@pytest.mark.parametrize("address", [
    "8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "2a00:1450:4001::1",
    "::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2002:808:808::1",
])
def test_public_addresses_are_allowed(address):
    assert blocked_reason(address) is None


def test_the_test_policy_allows_only_loopback_beyond_the_real_one():
    assert loopback_allowed_for_tests("127.0.0.1") is None
    assert loopback_allowed_for_tests("::1") is None
    assert loopback_allowed_for_tests("10.0.0.1") is not None
    assert loopback_allowed_for_tests("169.254.169.254") is not None


@pytest.mark.parametrize("url", [
    "ftp://files.test/a.pdf", "file:///etc/passwd", "http://user:pw@files.test/",
    "http://files.test:99999/", "http:///nohost", "http://files.test/a b",
    "http://files.test/\r\nX-Injected: 1", "http://" + "a" * 3000 + ".test/",
])
def test_unusable_urls_are_refused(url):
    with pytest.raises(UrlRefused):
        split_url(url)


def test_every_resolved_address_must_be_public():
    def resolver(host, port):
        return {"good.test": ["8.8.8.8"], "mixed.test": ["8.8.8.8", "10.0.0.7"],
                "none.test": []}[host]

    resolved = check_public_url("https://good.test/x?y=1", resolver)
    assert resolved.addresses == ("8.8.8.8",) and resolved.target == "/x?y=1"
    assert resolved.host_header == "good.test" and resolved.port == 443
    with pytest.raises(UrlRefused, match="10.0.0.7"):
        check_public_url("http://mixed.test/", resolver)
    with pytest.raises(UrlRefused):
        check_public_url("http://none.test/", resolver)


def test_a_resolver_that_hangs_is_cut_off_by_the_deadline():
    release = threading.Event()

    def resolver(host, port):
        release.wait(30)
        return ["8.8.8.8"]

    try:
        with pytest.raises(UrlRefused, match="took too long"):
            check_public_url("http://slow.test/", resolver, timeout_s=0.2)
    finally:
        release.set()


# ---- against a local server --------------------------------------------------------------------
class Upstream:
    """A scriptable HTTP server on 127.0.0.1 that records what it was sent."""

    def __init__(self):
        self.requests: list[dict] = []
        self.routes = {}
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                upstream.requests.append({"path": self.path, "method": self.command,
                                          "headers": dict(self.headers),
                                          "body": self.rfile.read(length)})
                upstream.routes.get(self.path, not_found)(self)

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "files.test") -> str:
        return f"http://{host}:{self.port}{path}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def reply(status=200, body=b"", headers=None):
    def handle(handler):
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    return handle


def not_found(handler):
    reply(404, b"SECRET internal detail")(handler)


@pytest.fixture
def upstream():
    server = Upstream()
    yield server
    server.stop()


RESOLVE = {"files.test": ["127.0.0.1"], "other.test": ["127.0.0.1"],
           "internal.test": ["10.0.0.5"], "metadata.test": ["169.254.169.254"]}


def local_client(max_bytes=1000, timeout_s=5.0, **options) -> SafeHttpClient:
    return SafeHttpClient(timeout_s, max_bytes, resolver=lambda host, port: RESOLVE[host],
                          policy=loopback_allowed_for_tests, **options)


def test_fetches_from_the_checked_address_with_the_right_host_header(upstream):
    upstream.routes["/doc.pdf"] = reply(body=b"%PDF-1.7 hello")
    assert local_client().get(upstream.url("/doc.pdf")) == b"%PDF-1.7 hello"
    (request,) = upstream.requests
    assert request["headers"]["Host"] == f"files.test:{upstream.port}"


def test_redirects_are_followed_and_each_one_is_checked(upstream):
    upstream.routes["/a"] = reply(302, headers={"Location": "/b"})
    upstream.routes["/b"] = reply(301, headers={"Location": upstream.url("/c", "other.test")})
    upstream.routes["/c"] = reply(body=b"done")
    assert local_client().get(upstream.url("/a")) == b"done"
    assert [r["path"] for r in upstream.requests] == ["/a", "/b", "/c"]
    assert upstream.requests[-1]["headers"]["Host"] == f"other.test:{upstream.port}"

    upstream.requests.clear()
    for target in ("http://internal.test/", "http://metadata.test/latest/meta-data/",
                   "http://127.0.0.1:1/", "file:///etc/passwd"):
        upstream.routes["/to-private"] = reply(302, headers={"Location": target})
        client = local_client() if "127.0.0.1" not in target else SafeHttpClient(
            5, 1000, resolver=lambda host, port: RESOLVE.get(host, [host]))
        with pytest.raises(UrlRefused):
            client.get(upstream.url("/to-private"))


def test_redirect_chains_are_bounded(upstream):
    upstream.routes["/loop"] = reply(302, headers={"Location": "/loop"})
    with pytest.raises(UrlRefused, match="redirects"):
        local_client().get(upstream.url("/loop"))
    assert len(upstream.requests) == MAX_REDIRECTS + 1


def test_bodies_over_the_cap_are_refused_declared_or_streamed(upstream):
    upstream.routes["/big"] = reply(body=b"x" * 5000)

    def chunked(handler):
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for _ in range(10):
            handler.wfile.write(b"200\r\n" + b"y" * 512 + b"\r\n")
        handler.wfile.write(b"0\r\n\r\n")

    upstream.routes["/chunked"] = chunked
    for path in ("/big", "/chunked"):
        with pytest.raises(FetchTooLarge):
            local_client(max_bytes=1000).get(upstream.url(path))


def test_one_deadline_covers_a_server_that_trickles(upstream):
    stop = threading.Event()

    def trickle(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        while not stop.is_set():  # a byte at a time: every single read is quick
            try:
                handler.wfile.write(b"z")
                handler.wfile.flush()
            except OSError:
                return
            stop.wait(0.02)

    upstream.routes["/slow"] = trickle
    try:
        with pytest.raises(UrlRefused, match="deadline"):
            local_client(max_bytes=10**6, timeout_s=0.5).get(upstream.url("/slow"))
    finally:
        stop.set()


def test_production_policy_never_connects_to_loopback(upstream):
    upstream.routes["/doc.pdf"] = reply(body=b"%PDF-1.7")
    client = SafeHttpClient(5, 1000, resolver=lambda host, port: RESOLVE[host])
    with pytest.raises(UrlRefused, match="loopback"):
        client.get(upstream.url("/doc.pdf"))
    literal = SafeHttpClient(5, 1000)  # the system resolver, on IP literals only
    for host in ("127.0.0.1", "[::ffff:127.0.0.1]", "2130706433", "0x7f.1"):
        with pytest.raises(UrlRefused):
            literal.get(f"http://{host}:{upstream.port}/doc.pdf")
    assert upstream.requests == []


def test_proxy_variables_and_netrc_are_ignored(upstream, monkeypatch, tmp_path):
    proxy = Upstream()
    try:
        proxy.routes["/"] = reply(body=b"from the proxy")
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
        netrc = tmp_path / ".netrc"
        netrc.write_text("machine files.test login user password hunter2\n")
        netrc.chmod(0o600)
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("NETRC", str(netrc))
        upstream.routes["/doc.pdf"] = reply(body=b"direct")
        assert local_client().get(upstream.url("/doc.pdf")) == b"direct"
        assert proxy.requests == []
        assert "Authorization" not in upstream.requests[0]["headers"]
    finally:
        proxy.stop()


def test_caller_sees_a_generic_message_never_the_upstream_status_or_body(upstream):
    fetch = make_url_fetcher(1000, 5, client=local_client())
    with pytest.raises(ApiError) as caught:
        fetch(upstream.url("/missing"))
    assert caught.value.status == 422
    assert "404" not in caught.value.message and "SECRET" not in caught.value.message
    upstream.routes["/big"] = reply(body=b"x" * 5000)
    with pytest.raises(ApiError) as caught:
        fetch(upstream.url("/big"))
    assert caught.value.status == 413


def test_post_for_callbacks_checks_the_url_and_returns_the_status(upstream):
    upstream.routes["/hook"] = reply(204)
    client = local_client()
    assert client.post(upstream.url("/hook"), b'{"done":true}',
                       {"Content-Type": "application/json"}) == 204
    assert upstream.requests[0]["body"] == b'{"done":true}'
    assert upstream.requests[0]["method"] == "POST"
    with pytest.raises(UrlRefused):
        client.post("http://internal.test/hook", b"{}")
    assert client.check(upstream.url("/hook")).addresses == ("127.0.0.1",)


# Each IPv6 form that embeds an IPv4 address, with a non-public one inside (loopback,
# private, metadata): refused whichever way it is written
@pytest.mark.parametrize("address", [
    "::ffff:0:7f00:1", "::ffff:0:127.0.0.1", "::ffff:0:a00:1", "::ffff:0:169.254.169.254",
    "::ffff:0:0.0.0.0", "::ffff:7f00:1", "0:0:0:0:0:ffff:c0a8:1", "::7f00:1", "::a9fe:a9fe",
    "2002:7f00:1::1", "2002:a9fe:a9fe::", "2002:c0a8:101:1::1", "64:ff9b::7f00:1",
    "64:ff9b::a00:1", "64:ff9b:1::7f00:1", "64:ff9b:1:7f:0:100::",
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1 (inverted bits)
    "2001:0:7f00:1:8000:63bf:f7f7:f7f7",  # Teredo, server 127.0.0.1
    "2001:0:4136:e378:8000:63bf:5601:5601",  # Teredo, client 169.254.169.254
    "::ffff:0:0:7f00:1", "::1:7f00:1", "5f00::7f00:1", "3fff::1",  # outside 2000::/3, docs
])
def test_every_ipv6_form_of_a_non_public_ipv4_address_is_refused(address):
    assert blocked_reason(address) is not None
    with pytest.raises(UrlRefused):
        check_public_url("http://sneaky.test/", lambda host, port: [address])


def test_ipv6_forms_of_unspecified_or_multicast_stay_refused_when_private_is_allowed():
    for address in ("::ffff:0.0.0.0", "::ffff:0:0.0.0.0", "64:ff9b::e000:1", "2002:e000:1::1"):
        assert private_allowed(address) is not None, address
    assert private_allowed("::ffff:10.0.0.1") is None and private_allowed("10.0.0.1") is None


@pytest.mark.parametrize("address", ["::ffff:0:808:808", "64:ff9b::1.1.1.1",
                                     "2002:101:101::1"])
def test_forms_that_reach_a_public_ipv4_address_are_allowed(address):
    assert blocked_reason(address) is None


def test_an_ipv4_mapped_resolution_is_checked_as_its_ipv4_address():
    resolved = ipaddress.ip_address("::ffff:192.168.0.1")
    assert "192.168.0.1" in blocked_reason(resolved)
    with pytest.raises(UrlRefused):
        check_public_url("http://sneaky.test/", lambda host, port: [str(resolved)])


def test_url_input_through_both_apps_refuses_loopback(upstream):
    """End to end with the production fetcher: both tiers answer a URL pointing at this
    machine with the generic 422 and never connect to it."""
    from gateway.app import create_app as gateway_app
    from gateway.config import GatewayConfig
    from services.ocr_worker.app import create_app as worker_app
    from services.ocr_worker.config import WorkerConfig

    upstream.routes["/doc.pdf"] = reply(body=b"%PDF-1.7")
    apps = [gateway_app(GatewayConfig(replicas=("http://127.0.0.1:9",), allow_url_input=True,
                                      url_timeout_s=5), start=False),
            worker_app(WorkerConfig(engine="sim", allow_url_input=True, url_timeout_s=5,
                                    warmup=False))]
    for app in apps:
        if "ocr_service" in app.extensions:
            assert app.extensions["ocr_service"].batcher.ready.wait(30)
        response = app.test_client().post(
            "/ocr", json={"file": f"http://127.0.0.1:{upstream.port}/doc.pdf"})
        assert response.status_code == 422, response.get_json()
        assert "public http(s) address" in response.get_json()["errorMsg"]
    assert upstream.requests == []
    apps[1].extensions["ocr_service"].shutdown(5)
