"""The gateway's two sides of access control, in one place:

- who may call the gateway: `access_policy(config)`: GATEWAY_API_KEYS on every path except
  the probes and the web page (`/` and its static files), /metrics on GATEWAY_METRICS_PORT
  when set (services/flask_common/access.py enforces it);
- how the gateway proves itself to the workers: `worker_auth_headers(config)`, to be sent
  with every request to a worker (workers with OCR_API_TOKEN answer 401 without it)."""

from __future__ import annotations

from services.flask_common.access import PROBE_PATHS, AccessPolicy

from .config import GatewayConfig

# Served without a key, so a browser can load the page that then asks for the key: keep this
# list short and explicit (the page's files hold no data). The page's API calls (/ocr,
# /fleet, ...) carry the key.
WEB_PAGE_PATHS = frozenset({"/"})
WEB_PAGE_PREFIXES = ("/ui/",)  # gateway/web.py serves the page's files here


def access_policy(config: GatewayConfig) -> AccessPolicy:
    return AccessPolicy(keys=config.api_keys, open_paths=PROBE_PATHS | WEB_PAGE_PATHS,
                        open_prefixes=WEB_PAGE_PREFIXES, metrics_port=config.metrics_port)


def worker_auth_headers(config: GatewayConfig) -> dict[str, str]:
    """Headers for every request the gateway sends to a worker (pages and probes alike)."""
    if not config.worker_token:
        return {}
    return {"Authorization": f"Bearer {config.worker_token}"}
