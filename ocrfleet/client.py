"""One document through the gateway over HTTP, with the retries a batch needs: 429 and 503
are waited out as their Retry-After says (up to a total wait per document), network errors
and 502/504 are retried with exponential backoff and jitter (up to `retries` times); any other
answer is final, and an error's reason is the envelope's errorMsg."""

from __future__ import annotations

import io
import random
import threading
import time
import zipfile
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path

import requests

from services.ocr_api.headers import CACHED_PAGES as CACHED_HEADER
from services.ocr_api.headers import PAGES as PAGES_HEADER

FORMATS = {"json": "application/json", "txt": "text/plain", "pdf": "application/pdf",
           "alto": "application/alto+xml", "hocr": "text/vnd.hocr+html",
           "md": "text/markdown"}
LAYOUT = "md"  # the document's Markdown: /layout-parsing's, alone (no ZIP holds it)
ZIP = "application/zip"
ZIP_MEMBERS = {"json": "result.json", "txt": "text.txt", "pdf": "searchable.pdf",
               "alto": "result.alto.xml", "hocr": "result.hocr"}
BUSY = (429, 503)
TRANSIENT = (502, 504)
NETWORK_ERRORS = (requests.ConnectionError, requests.Timeout,
                  requests.exceptions.ChunkedEncodingError)


class OcrFailed(Exception):
    def __init__(self, reason: str, status: int | None = None, attempts: int = 1):
        super().__init__(reason)
        self.reason, self.status, self.attempts = reason, status, attempts


@dataclass
class Settings:
    url: str = "http://127.0.0.1:8080"
    api_key: str | None = None
    timeout_s: float = 900.0
    connect_timeout_s: float = 10.0
    retries: int = 5
    max_wait_s: float = 600.0  # total Retry-After waiting per document
    backoff_s: float = 1.0
    visualize: bool = False


@dataclass
class Answer:
    outputs: dict[str, bytes]  # format -> bytes
    pages: int
    attempts: int
    cached: int | None = None  # pages the gateway answered from its page cache (None: off)


def retry_after(response: requests.Response) -> float | None:
    """Retry-After in seconds (delta-seconds or an HTTP date), None when absent."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def cached_pages(response: requests.Response) -> int | None:
    """X-Ocr-Cached-Pages: how many pages came from the gateway's page cache; None when the
    gateway does not say (its cache is off, or an older gateway)."""
    try:
        return max(0, int(response.headers[CACHED_HEADER]))
    except (KeyError, ValueError):
        return None


def backoff(attempt: int, base_s: float) -> float:
    return min(30.0, base_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)


def error_reason(response: requests.Response) -> str:
    try:
        body = response.json()
        return f"HTTP {response.status_code}: {body.get('errorMsg') or response.reason}"
    except ValueError:
        return f"HTTP {response.status_code}: {response.reason}"


def split_bundle(content: bytes, formats: list[str]) -> dict[str, bytes]:
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            return {fmt: archive.read(ZIP_MEMBERS[fmt]) for fmt in formats}
    except (zipfile.BadZipFile, KeyError) as exc:
        raise OcrFailed(f"the gateway's ZIP answer is unreadable ({exc})", 200) from None


class Client:
    """Thread-safe: each thread gets its own requests.Session (connection reuse)."""

    def __init__(self, settings: Settings, sleep=time.sleep):
        self.settings = settings
        self._local = threading.local()
        self._sleep = sleep

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            if self.settings.api_key:
                session.headers["Authorization"] = f"Bearer {self.settings.api_key}"
        return session

    def _post(self, path: Path, accept: str) -> requests.Response:
        """One try: the Markdown from /layout-parsing, every other format from /ocr."""
        endpoint = "/layout-parsing" if accept == FORMATS[LAYOUT] else "/ocr"
        with open(path, "rb") as handle:
            return self._session().post(
                self.settings.url.rstrip("/") + endpoint,
                files={"file": (path.name, handle)},
                data={"visualize": "true" if self.settings.visualize else "false"},
                headers={"Accept": accept},
                timeout=(self.settings.connect_timeout_s, self.settings.timeout_s))

    def ocr(self, path: Path, formats: list[str]) -> Answer:
        """The document in each of `formats` from one OCR pass (a ZIP bundle when several)."""
        accept = FORMATS[formats[0]] if len(formats) == 1 else ZIP
        waited, errors, attempt = 0.0, 0, 0
        while True:
            attempt += 1
            try:
                response = self._post(path, accept)
            except NETWORK_ERRORS as exc:
                errors += 1
                if errors > self.settings.retries:
                    raise OcrFailed(f"network error: {exc}", None, attempt) from None
                self._sleep(backoff(errors, self.settings.backoff_s))
                continue
            status = response.status_code
            if status == 200:
                content = response.content
                outputs = (split_bundle(content, formats) if accept == ZIP
                           else {formats[0]: content})
                return Answer(outputs, int(response.headers.get(PAGES_HEADER) or 0), attempt,
                              cached_pages(response))
            if status in BUSY:
                delay = retry_after(response)
                delay = backoff(attempt, self.settings.backoff_s) if delay is None else delay
                if waited + delay > self.settings.max_wait_s:
                    raise OcrFailed(f"{error_reason(response)} (still busy after waiting "
                                    f"{waited:.0f} s)", status, attempt)
                waited += delay
                self._sleep(delay)
                continue
            if status in TRANSIENT:
                errors += 1
                if errors <= self.settings.retries:
                    self._sleep(backoff(errors, self.settings.backoff_s))
                    continue
            raise OcrFailed(error_reason(response), status, attempt)
