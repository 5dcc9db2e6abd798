"""Fetching a `file` given as an http(s) URL, only where the operator enabled URL input, and
only from public addresses (no server-side request forgery into the cluster, the node or the
cloud's metadata service).

How, step by step, for the URL and again for every redirect (at most MAX_REDIRECTS):
- the URL must be http or https, without user:password, at most MAX_URL_CHARS long;
- its host is resolved once, and every address it resolves to must pass `blocked_reason`
  (a pure function: loopback, private, link-local, CGNAT, multicast, reserved, every IPv6
  form that embeds such an IPv4 address (mapped, translated, IPv4-compatible, 6to4, NAT64,
  Teredo) and IPv6 outside the global unicast block are refused);
- the connection goes to that checked address itself (no second lookup an attacker's DNS
  could answer differently), with the URL's host as Host header and TLS server name;
- one deadline covers resolving, connecting, TLS, every redirect and every read: a watchdog
  shuts the socket down when it passes, so a server trickling bytes cannot stretch it;
- the body is streamed with a size cap; nothing is read from the environment (no proxy
  variables, no .netrc: http.client never looks at them).
Every failure reaches the caller as one generic message; the reason (never the upstream's
status or body) goes to the log.

`SafeHttpClient` is reusable for other outbound calls to caller-given URLs (job callbacks):
`get(url) -> bytes`, `post(url, body, headers) -> status`, and `check_public_url(url)` for
validating a URL when it is accepted.
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable
from urllib.parse import urljoin, urlsplit

from .errors import excerpt, too_large, unprocessable

log = logging.getLogger("url_input")

MAX_URL_CHARS = 2048
MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# ---- the address policy (pure) ------------------------------------------------------------------
_BLOCKED = [(ipaddress.ip_network(net), why) for net, why in [
    ("0.0.0.0/8", "unspecified/this network"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT (RFC 6598)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata lives at 169.254.169.254)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible IPv6 (deprecated)"),
    ("100::/64", "discard-only"),
    ("64:ff9b:1::/48", "local-use NAT64 (RFC 8215)"),
    ("2001::/23", "IETF protocol assignments (Teredo and others)"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation (RFC 9637)"),
    ("fc00::/7", "unique local (private IPv6)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
]]
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")  # every other IPv6 block is not the Internet
# IPv6 forms whose packets go to the IPv4 address they embed (a translator, a relay, the host's
# own stack): each is judged by that address
_TRANSLATED = [ipaddress.ip_network(net) for net in (
    "::ffff:0:0/96",  # IPv4-mapped (RFC 4291)
    "::ffff:0:0:0/96",  # IPv4-translated (RFC 2765, SIIT)
    "64:ff9b::/96",  # NAT64 well-known prefix (RFC 6052)
)]
_COMPATIBLE = ipaddress.ip_network("::/96")  # IPv4-compatible (deprecated), :: and ::1 aside
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")  # bits 16-48 are an IPv4 address


def embedded_ipv4(address: Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address embeds: the last 32 bits of the mapped,
    translated, NAT64 and IPv4-compatible forms; 6to4's bits 16-48; Teredo's server and
    client (RFC 4380). Empty for any other address."""
    if address.version == 4:
        return ()
    if any(address in network for network in _TRANSLATED) or (
            address in _COMPATIBLE and int(address) > 1):
        return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
    if address in _SIX_TO_FOUR:
        return (ipaddress.IPv4Address((int(address) >> 80) & 0xFFFFFFFF),)
    if address.teredo is not None:
        return address.teredo
    return ()


def blocked_reason(address: Address | str) -> str | None:
    """Why the service must not connect to `address`, or None for a public one. An IPv6 form
    that embeds an IPv4 address is refused when that address is not public; the mapped,
    translated, NAT64 and 6to4 forms are allowed when it is (packets go to it). Every other
    IPv6 address must be in the global unicast block 2000::/3 and public there."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.split("%", 1)[0])
    inner = embedded_ipv4(address)
    for ipv4 in inner:
        why = blocked_reason(ipv4)
        if why:
            return f"IPv6 form of {ipv4}: {why}"
    if inner and (address in _SIX_TO_FOUR or any(address in n for n in _TRANSLATED)):
        return None
    for network, why in _BLOCKED:
        if address.version == network.version and address in network:
            return why
    if address.version == 6 and address not in _GLOBAL_UNICAST:
        return "outside IPv6 global unicast (2000::/3)"
    if not address.is_global:  # whatever else Python's registry knows to be non-public
        return "not a globally routable address"
    return None


def private_allowed(address: Address | str) -> str | None:
    """The operator's opt-in for receivers inside their own network (job callbacks with
    GATEWAY_JOBS_CALLBACK_ALLOW_PRIVATE): any unicast address. Unspecified and multicast
    addresses are still refused, in their IPv6 forms too: nothing answers there (0.0.0.0 is
    this very host)."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.split("%", 1)[0])
    for candidate in (address, *embedded_ipv4(address)):
        if candidate.is_unspecified or candidate.is_multicast:
            return "not a unicast address"
    return None


def loopback_allowed_for_tests(address: Address | str) -> str | None:
    """A policy for tests only: the real one, except that loopback is allowed so that a test
    can serve files from 127.0.0.1. No configuration selects it; only a test passes it."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.split("%", 1)[0])
    return None if address.is_loopback else blocked_reason(address)


# ---- URLs and resolution ------------------------------------------------------------------------
class UrlRefused(Exception):
    """The URL or its target is not allowed, or the fetch failed; the message is for the log."""


class FetchTooLarge(UrlRefused):
    pass


@dataclass(frozen=True)
class ResolvedUrl:
    scheme: str
    host: str  # ASCII (IDNA) host name or IP literal, without brackets
    port: int
    target: str  # path and query, as sent in the request line
    addresses: tuple[str, ...]  # every address the host resolved to, all checked

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


Resolver = Callable[[str, int], Iterable[str]]
Policy = Callable[[Address | str], "str | None"]


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def split_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, ASCII host, port, target) of an acceptable http(s) URL, else UrlRefused."""
    if len(url) > MAX_URL_CHARS:
        raise UrlRefused(f"URL of {len(url)} characters")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise UrlRefused("URL with whitespace or control characters")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UrlRefused(f"scheme {excerpt(scheme)}")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("URL with credentials")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise UrlRefused("invalid port") from None
    host = parts.hostname or ""
    if not host:
        raise UrlRefused("URL without a host")
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise UrlRefused("host name that is not valid IDNA") from None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, host, port, target


def check_public_url(url: str, resolver: Resolver | None = None,
                     policy: Policy = blocked_reason,
                     timeout_s: float | None = None) -> ResolvedUrl:
    """Validate `url` and resolve its host once; UrlRefused unless every address it resolves
    to is allowed by `policy`. The returned addresses are the ones to connect to."""
    scheme, host, port, target = split_url(url)
    addresses = _resolve(resolver or system_resolver, host, port, timeout_s)
    if not addresses:
        raise UrlRefused(f"{excerpt(host)} resolves to no address")
    for address in addresses:
        try:
            why = policy(address)
        except ValueError:
            why = "not an IP address"
        if why:
            raise UrlRefused(f"{excerpt(host)} resolves to {address}: {why}")
    return ResolvedUrl(scheme, host, port, target, tuple(addresses))


def _resolve(resolver: Resolver, host: str, port: int, timeout_s: float | None) -> list[str]:
    """The resolver's answer within `timeout_s` (getaddrinfo has no timeout of its own: it runs
    in a daemon thread that is abandoned if it overruns)."""
    answer: list = []

    def run():
        try:
            answer.append(list(resolver(host, port)))
        except (OSError, UnicodeError) as exc:
            answer.append(exc)

    thread = threading.Thread(target=run, daemon=True, name="url-resolve")
    thread.start()
    thread.join(timeout_s)
    if not answer:
        raise UrlRefused(f"resolving {excerpt(host)} took too long")
    if isinstance(answer[0], Exception):
        raise UrlRefused(f"{excerpt(host)} does not resolve ({type(answer[0]).__name__})")
    return answer[0]


# ---- the client ---------------------------------------------------------------------------------
class _Deadline:
    def __init__(self, seconds: float):
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise UrlRefused("the deadline passed")
        return left


class _Watchdog:
    """Shuts the watched sockets down at the deadline, so that every blocked connect, read or
    write on them returns at once however the server paces its bytes; closes them at the end."""

    def __init__(self, deadline: _Deadline):
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.timer = threading.Timer(max(0.0, deadline.at - time.monotonic()), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def watch(self, sock: socket.socket) -> socket.socket:
        with self.lock:
            self.sockets.append(sock)
        return sock

    def _fire(self) -> None:
        with self.lock:
            for sock in self.sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cancel(self) -> None:
        self.timer.cancel()
        with self.lock:
            for sock in self.sockets:
                sock.close()


class SafeHttpClient:
    """Outbound HTTP(S) to caller-given URLs, public addresses only (see the module doc).

    `policy` and `resolver` exist for tests (loopback_allowed_for_tests, a fixed resolver);
    production code passes neither, and no setting changes them."""

    def __init__(self, timeout_s: float, max_bytes: int, *, max_redirects: int = MAX_REDIRECTS,
                 resolver: Resolver | None = None, policy: Policy = blocked_reason,
                 ssl_context: ssl.SSLContext | None = None, user_agent: str = "ocrfleet"):
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_redirects = max_redirects
        self.resolver = resolver
        self.policy = policy
        self.ssl_context = ssl_context or _default_ssl_context()
        self.user_agent = user_agent

    def check(self, url: str) -> ResolvedUrl:
        return check_public_url(url, self.resolver, self.policy, self.timeout_s)

    def get(self, url: str) -> bytes:
        """The body of a 200 answer at `url` (redirects followed, each re-checked);
        FetchTooLarge past max_bytes, UrlRefused for anything else."""
        deadline = _Deadline(self.timeout_s)
        for _ in range(self.max_redirects + 1):
            status, location, body = self._exchange("GET", url, None, {}, deadline,
                                                    read_body=True)
            if status in REDIRECTS and location:
                url = urljoin(url, location)
                continue
            if status != 200:
                raise UrlRefused(f"answered HTTP {status}")
            return body
        raise UrlRefused(f"more than {self.max_redirects} redirects")

    def post(self, url: str, body: bytes, headers: dict[str, str] | None = None) -> int:
        """POST `body` to `url` and return the status; redirects are not followed (a
        callback target answers itself) and the answer's body is not read. UrlRefused when
        the URL is not allowed or the exchange fails."""
        status, _, _ = self._exchange("POST", url, body, headers or {},
                                      _Deadline(self.timeout_s), read_body=False)
        return status

    # one request/answer on one checked address
    def _exchange(self, method, url, body, headers, deadline: _Deadline, read_body: bool):
        resolved = check_public_url(url, self.resolver, self.policy, deadline.left())
        watchdog = _Watchdog(deadline)
        connection = None
        try:
            sock = self._connect(resolved, deadline, watchdog)
            connection_class = (http.client.HTTPSConnection if resolved.scheme == "https"
                                else http.client.HTTPConnection)
            connection = connection_class(resolved.host, resolved.port)
            connection.sock = sock  # already connected to the checked address
            connection.request(method, resolved.target, body=body, headers={
                **headers, "Host": resolved.host_header, "User-Agent": self.user_agent,
                "Accept-Encoding": "identity", "Connection": "close"})
            response = connection.getresponse()
            location = response.getheader("Location") if response.status in REDIRECTS else None
            if response.status in REDIRECTS or not read_body:
                return response.status, location, b""
            return response.status, None, self._read(response, deadline)
        except (OSError, http.client.HTTPException) as exc:
            deadline.left()  # the watchdog's doing: say so
            raise UrlRefused(f"{type(exc).__name__} talking to {excerpt(resolved.host)}") \
                from None
        finally:
            if connection is not None:
                connection.close()  # the socket and the response's file on it
            watchdog.cancel()

    def _connect(self, resolved: ResolvedUrl, deadline: _Deadline,
                 watchdog: "_Watchdog") -> socket.socket:
        last_error: Exception | None = None
        for address in resolved.addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = watchdog.watch(socket.socket(family, socket.SOCK_STREAM))
            try:
                sock.settimeout(deadline.left())
                sock.connect((address, resolved.port))
                if resolved.scheme == "https":  # wrapping detaches `sock`: watch the new one
                    sock = watchdog.watch(self.ssl_context.wrap_socket(
                        sock, server_hostname=resolved.host, do_handshake_on_connect=False))
                    sock.do_handshake()
                sock.settimeout(None)  # the watchdog bounds every read from here on
                return sock
            except (OSError, ssl.SSLError) as exc:
                last_error = exc
        deadline.left()
        raise UrlRefused(f"could not connect to {excerpt(resolved.host)} "
                         f"({type(last_error).__name__})")

    def _read(self, response: http.client.HTTPResponse, deadline: _Deadline) -> bytes:
        declared = response.getheader("Content-Length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise FetchTooLarge(f"Content-Length {declared}")
        chunks, size = [], 0
        while chunk := response.read(65536):
            size += len(chunk)
            if size > self.max_bytes:
                raise FetchTooLarge(f"over {self.max_bytes} bytes")
            chunks.append(chunk)
        deadline.left()  # a body cut short by the watchdog is not a body
        return b"".join(chunks)


def _default_ssl_context() -> ssl.SSLContext:
    try:
        import certifi  # requests' CA bundle, the same trust the rest of the service uses

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:
        return ssl.create_default_context()


# ---- the /ocr `file` fetcher --------------------------------------------------------------------
def make_url_fetcher(max_bytes: int, timeout_s: float, client: SafeHttpClient | None = None):
    """fetch(url) -> bytes for parse_ocr_request; every failure is one generic ApiError."""
    client = client or SafeHttpClient(timeout_s, max_bytes)

    def fetch(url: str) -> bytes:
        try:
            return client.get(url)
        except FetchTooLarge as exc:
            log.warning("URL input refused: %s", exc)
            raise too_large(f"The file at the URL is over this server's {max_bytes}-byte "
                            "limit") from None
        except UrlRefused as exc:
            log.warning("URL input refused: %s", exc)
            raise unprocessable(
                f"Could not fetch 'file' from the URL: it must be a public http(s) address "
                f"that answers 200 with the file within {client.timeout_s:g} s. Or send the "
                "file's bytes base64-encoded in 'file'") from None
    return fetch


__all__ = ["FetchTooLarge", "ResolvedUrl", "SafeHttpClient", "UrlRefused",
           "blocked_reason", "check_public_url", "embedded_ipv4", "loopback_allowed_for_tests",
           "make_url_fetcher", "private_allowed", "split_url"]
