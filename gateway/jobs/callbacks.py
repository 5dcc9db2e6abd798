"""Job callbacks: the small JSON the gateway POSTs to `callbackUrl` when a job ends, signed
like Stripe's webhooks, sent through the one outbound client the gateway has for caller-given
URLs (services/ocr_api/url_input.SafeHttpClient, which URL input uses too).

Signature: header `X-OCRFleet-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>` over
`"<t>." + body` under GATEWAY_JOBS_CALLBACK_SECRET. A receiver recomputes it, compares in
constant time and refuses old timestamps (replays); `verify_signature` does exactly that.

Where: the client's rules, the same as URL input's: http(s) only, no credentials in the URL,
every address the host resolves to must be public (`blocked_reason`: private, loopback,
link-local, CGNAT, and the IPv6 forms that embed such an address: mapped, translated, NAT64,
6to4, IPv4-compatible, Teredo), the connection goes to the checked address itself, one
deadline covers the whole exchange (a receiver that drips its answer is cut off), redirects
are not followed and the answer's body is not read (nor decompressed).
GATEWAY_JOBS_CALLBACK_ALLOW_PRIVATE allows receivers inside your own network
(`private_allowed`)."""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

from services.ocr_api import headers
from services.ocr_api.errors import unprocessable
from services.ocr_api.url_input import SafeHttpClient, UrlRefused, private_allowed

SIGNATURE_HEADER = headers.SIGNATURE


def callback_client(timeout_s: float, allow_private: bool) -> SafeHttpClient:
    """The outbound client for callbacks: `timeout_s` for a whole attempt."""
    if allow_private:
        return SafeHttpClient(timeout_s, 0, max_redirects=0, policy=private_allowed,
                              user_agent="ocrfleet-gateway")
    return SafeHttpClient(timeout_s, 0, max_redirects=0, user_agent="ocrfleet-gateway")


# ---- signing --------------------------------------------------------------------------------
def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    timestamp = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify_signature(secret: str, header: str, body: bytes, tolerance_s: float = 300,
                     now: float | None = None) -> bool:
    """What a receiver does: the header parses, a v1 signature matches, t is recent. Any
    header at all (non-ASCII included) gets True or False, never an exception."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
    except (ValueError, KeyError, AttributeError):
        return False
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret, body, timestamp).split("v1=", 1)[1].encode()
    given = parts.get("v1", "").encode("utf-8", "surrogatepass")
    return hmac.compare_digest(expected, given)


# ---- where a callback may go ----------------------------------------------------------------
def check_callback_url(url: object, client: SafeHttpClient) -> str:
    """At submit time: the URL as given, or a 422 the caller can act on."""
    if not isinstance(url, str):
        raise unprocessable("callbackUrl refused: it must be an http(s) URL")
    try:
        client.check(url)
    except UrlRefused as exc:
        raise unprocessable(f"callbackUrl refused: {exc}") from None
    return url


# ---- sending --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    delivered: bool
    detail: str  # "HTTP 200", "HTTP 500", "refused: ..."


class CallbackSender:
    def __init__(self, secret: str, client: SafeHttpClient):
        self.secret = secret
        self.client = client

    def send(self, url: str, body: bytes, job_id: str) -> Delivery:
        """One attempt: 2xx is delivered; anything else (3xx included: redirects are not
        followed) is a failed attempt."""
        sent = {"Content-Type": "application/json", headers.JOB_ID: job_id,
                headers.SIGNATURE: sign(self.secret, body)}
        try:
            status = self.client.post(url, body, sent)
        except UrlRefused as exc:
            return Delivery(False, f"refused: {exc}")
        return Delivery(200 <= status < 300, f"HTTP {status}")
