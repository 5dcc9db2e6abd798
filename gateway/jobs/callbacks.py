"""Job callbacks: the small JSON the gateway POSTs to `callbackUrl` when a job ends, signed
like Stripe's webhooks, and the rules for where it may be sent.

Signature: header `X-OCRFleet-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>` over
`"<t>." + body` under GATEWAY_JOBS_CALLBACK_SECRET. A receiver recomputes it, compares in
constant time and refuses old timestamps (replays); `verify_signature` does exactly that.

Where: http(s) only, no credentials in the URL, no redirects followed, and every address the
host resolves to must be public (SSRF: a job must not make the gateway call its own
cluster's services or a cloud metadata endpoint). The check is one injectable function
(`AddressPolicy`); the connection then goes to the checked address itself (the name is
resolved once), so DNS cannot answer differently between the check and the request."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

import urllib3

from services.ocr_api.errors import unprocessable

SIGNATURE_HEADER = "X-OCRFleet-Signature"
MAX_URL_CHARS = 2048

# (host, port) -> the addresses the request may connect to; raises CallbackRefused
AddressPolicy = Callable[[str, int], list[str]]


class CallbackRefused(ValueError):
    """The URL may not be called (scheme, credentials, or an address that is not public)."""


# ---- signing --------------------------------------------------------------------------------
def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    timestamp = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify_signature(secret: str, header: str, body: bytes, tolerance_s: float = 300,
                     now: float | None = None) -> bool:
    """What a receiver does: the header parses, a v1 signature matches, t is recent."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
    except (ValueError, KeyError):
        return False
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret, body, timestamp).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


# ---- where a callback may go ----------------------------------------------------------------
def _resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise CallbackRefused(f"cannot resolve {host}: {exc}") from None
    addresses = []
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        mapped = getattr(address, "ipv4_mapped", None)
        addresses.append(mapped or address)
    return addresses


def public_addresses(host: str, port: int) -> list[str]:
    """The default policy: every address of the host must be public (not private, loopback,
    link-local, shared, reserved, multicast or unspecified)."""
    addresses = _resolve(host, port)
    for address in addresses:
        if not address.is_global or address.is_multicast or address.is_unspecified:
            raise CallbackRefused(f"{host} resolves to {address}, which is not a public "
                                  "address")
    return [str(a) for a in addresses]


def any_address(host: str, port: int) -> list[str]:
    """GATEWAY_JOBS_CALLBACK_ALLOW_PRIVATE=true: receivers inside your own network (and the
    tests on 127.0.0.1) are allowed."""
    return [str(a) for a in _resolve(host, port)]


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str


def parse_url(url: object) -> Target:
    """The URL's parts, or CallbackRefused saying what is wrong with it (no DNS here)."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise CallbackRefused(f"callbackUrl must be an http(s) URL of at most {MAX_URL_CHARS} "
                              "characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise CallbackRefused(f"callbackUrl is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CallbackRefused("callbackUrl must start with http:// or https:// and name a host")
    if parts.username or parts.password:
        raise CallbackRefused("callbackUrl must not carry credentials; authenticate the "
                              "callback by its signature instead")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80),
                  path)


def check_callback_url(url: object, policy: AddressPolicy) -> str:
    """At submit time: the URL as given, or a 422 the caller can act on."""
    try:
        target = parse_url(url)
        policy(target.host, target.port)
    except CallbackRefused as exc:
        raise unprocessable(f"callbackUrl refused: {exc}") from None
    return url  # type: ignore[return-value]


# ---- sending --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    delivered: bool
    detail: str  # "HTTP 200", "HTTP 500", "timeout", "refused: ..."


class CallbackSender:
    def __init__(self, secret: str, policy: AddressPolicy, timeout_s: float):
        self.secret = secret
        self.policy = policy
        self.timeout = urllib3.Timeout(connect=min(5.0, timeout_s), read=timeout_s)

    def send(self, url: str, body: bytes, job_id: str) -> Delivery:
        """One attempt: 2xx is delivered; anything else (3xx included: redirects are not
        followed) is a failed attempt."""
        try:
            target = parse_url(url)
            address = self.policy(target.host, target.port)[0]
        except CallbackRefused as exc:
            return Delivery(False, f"refused: {exc}")
        headers = {"Content-Type": "application/json", "User-Agent": "ocrfleet-gateway",
                   "Host": _host_header(target), "X-OCRFleet-Job-Id": job_id,
                   SIGNATURE_HEADER: sign(self.secret, body)}
        pool = _pool(target, address, self.timeout)
        try:
            response = pool.urlopen("POST", target.path, body=body, headers=headers,
                                    redirect=False, retries=False, preload_content=True,
                                    assert_same_host=False)
        except urllib3.exceptions.HTTPError as exc:
            return Delivery(False, type(exc).__name__)
        finally:
            pool.close()
        return Delivery(200 <= response.status < 300, f"HTTP {response.status}")


def _host_header(target: Target) -> str:
    default = 443 if target.scheme == "https" else 80
    host = f"[{target.host}]" if ":" in target.host else target.host
    return host if target.port == default else f"{host}:{target.port}"


def _pool(target: Target, address: str, timeout: urllib3.Timeout) -> urllib3.HTTPConnectionPool:
    """A connection to the checked address; TLS still verifies the certificate for the
    URL's host name (SNI and hostname check use the name, not the address)."""
    if target.scheme == "https":
        return urllib3.HTTPSConnectionPool(address, target.port, timeout=timeout, maxsize=1,
                                           server_hostname=target.host,
                                           assert_hostname=target.host)
    return urllib3.HTTPConnectionPool(address, target.port, timeout=timeout, maxsize=1)


def backoff_s(base_s: float, attempts: int, cap_s: float = 600.0) -> float:
    """Delay before attempt `attempts + 1`: base, 2 x base, 4 x base, ... capped."""
    return min(cap_s, base_s * 2 ** max(0, attempts - 1))
