"""Fetching a `file` given as an http(s) URL, only where the operator enabled URL input:
bounded in time and size, redirects limited, the error a caller can act on."""

from __future__ import annotations

import requests

from .errors import ApiError, too_large, unprocessable


def make_url_fetcher(max_bytes: int, timeout_s: float):
    def fetch(url: str) -> bytes:
        try:
            with requests.get(url, stream=True, timeout=timeout_s,
                              allow_redirects=True) as response:
                if response.status_code != 200:
                    raise unprocessable(f"Fetching 'file' from {url} answered HTTP "
                                        f"{response.status_code}")
                chunks, size = [], 0
                for chunk in response.iter_content(65536):
                    size += len(chunk)
                    if size > max_bytes:
                        raise too_large(f"The file at {url} is over this server's "
                                        f"{max_bytes}-byte limit")
                    chunks.append(chunk)
                return b"".join(chunks)
        except ApiError:
            raise
        except requests.RequestException as exc:
            raise unprocessable(f"Could not fetch 'file' from {url}: "
                                f"{type(exc).__name__}") from None
    return fetch
