"""OcrService: one /ocr request's stages in order — decode the request, admit it, render its
pages into the inference queue, wait for the results, encode the PaddleX response. Holds the
engine, the batcher and admission control of this process. No Flask here."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Any, Callable, Mapping

from services.ocr_api import envelope, tracing
from services.ocr_api.errors import ApiError, unprocessable
from services.ocr_api.request import OcrRequest, parse_ocr_request
from services.ocr_api.url_input import make_url_fetcher

from . import metrics, recycle
from .admission import Admission, MemoryBudget, Reservation
from .batcher import DeadlineExceeded, EngineNotReady, InferenceBatcher, StartsLater
from .capacity import Pace, Presence, capacity_json
from .config import WorkerConfig
from .refusal import Refusals
from .decode import DecodeLimits, Document, TextLayerPage, open_document
from .encode import TextLayerOutput, data_info, encode_page
from .engine import Engine, create_engine
from .identity import engine_identity
from .memory import MIB, MemoryKeeper
from .layout import LayoutStage

log = logging.getLogger("ocr_worker")


class OcrService:
    def __init__(self, config: WorkerConfig, engine: Engine | None = None):
        self.config = config
        self.engine = engine or create_engine(config)
        self.admission = Admission(config.queue_size, config.retry_after_s)
        self.memory = MemoryBudget(config.memory_budget_mb * MIB, config.retry_after_s)
        self.keeper = MemoryKeeper(trim_min_pixels=config.trim_min_pixels,
                                   ceiling_bytes=config.memory_ceiling_mb * MIB,
                                   over_ceiling=recycle.request_replacement,
                                   observe=metrics.observe_rss)
        self.pace = Pace(batch=config.max_batch)
        self.presence = Presence(self.pace, draining=lambda: self.admission.draining)
        self.batcher = InferenceBatcher(
            self.engine, queue_pages=config.page_buffer, max_batch=config.max_batch,
            batch_wait_s=config.batch_wait_ms / 1000.0, warmup=config.warmup,
            observe=self._observe_batcher, after_batch=self.keeper.after_batch)
        self.refuse = Refusals(self.admission, self.batcher, self.pace, config.retry_after_s)
        self.limits = DecodeLimits(max_pages=config.max_pages, max_pixels=config.max_pixels,
                                   pdf_dpi=config.pdf_dpi,
                                   scan_dpi_max=config.pdf_scan_dpi_max)
        self.layout = LayoutStage(config)  # POST /layout-parsing (services/layout/)
        self.fetch_url = (make_url_fetcher(config.max_bytes, config.url_timeout_s)
                          if config.allow_url_input else None)
        self.visualize_by_default = (config.visualize_default
                                     and self.engine.unsupported({}, True) is None)
        self._identity: str | None = None
        self._identity_lock = threading.Lock()
        metrics.set_engine_info(self.engine.info)
        metrics.QUEUE_CAPACITY.set(config.queue_size)

    def start(self) -> None:
        self.batcher.start()

    def engine_identity(self) -> str | None:
        """What decides a page's result here (services/ocr_worker/identity.py), once the
        engine is loaded (its info is complete then); computed once."""
        if not self.batcher.ready.is_set():
            return None
        with self._identity_lock:
            if self._identity is None:
                self._identity = engine_identity(self.engine, self.config,
                                                 self.visualize_by_default)
        return self._identity

    def _observe_batcher(self, event: str, value) -> None:
        metrics.observe_batcher(event, value)
        self.pace.observe(event, value)

    def readiness(self) -> tuple[bool, str]:
        if self.admission.draining:
            return False, "draining: shutting down"
        if self.batcher.load_error:
            return False, self.batcher.load_error
        if not self.batcher.ready.is_set():
            return False, "the model is loading"
        return True, "ready"

    def capacity(self) -> dict[str, int]:
        """Admission slots and how many are free now (X-Ocr-Capacity / X-Ocr-Free)."""
        return capacity_json(self.admission.capacity, self.admission.free)

    # ---- stages ------------------------------------------------------------------------------
    def decode_request(self, fields: Mapping[str, Any], file_bytes: bytes | None,
                       layout: bool = False) -> OcrRequest:
        """`layout`: a /layout-parsing request (its own fields validated too)."""
        started = time.monotonic()
        options = self.layout.parse(fields) if layout else None
        ocr_request = parse_ocr_request(fields, max_bytes=self.config.max_bytes,
                                        file_bytes=file_bytes, fetch_url=self.fetch_url)
        if options is not None:
            self.layout.adopt(ocr_request, options)
        reason = self.engine.unsupported(ocr_request.pipeline_params,
                                         bool(ocr_request.visualize))
        if reason:
            raise unprocessable(reason)
        if ocr_request.visualize is None:
            # PaddleX serving visualizes unless asked not to (its clients decode ocrImage);
            # we do the same where a font lets us draw the text
            ocr_request.visualize = self.visualize_by_default
        metrics.STAGE_SECONDS.labels("decode").observe(time.monotonic() - started)
        return ocr_request

    def predict(self, ocr_request: OcrRequest, deadline: float | None = None,
                reservation: Reservation | None = None, first: bool = False,
                start_within_ms: int | None = None) -> dict[str, Any]:
        """Render, infer and encode one admitted request; returns the `result` object.
        `first`: its pages go before the pages already queued (X-Ocr-Priority: high);
        `start_within_ms`: its first page is refused (503) unless it would start that soon."""
        if deadline is None:
            deadline = time.monotonic() + self.config.request_timeout_s
        document = open_document(ocr_request, self.limits)
        try:
            if reservation is not None:
                reservation.grow_to(reservation.nbytes + self._pages_cost(document,
                                                                          ocr_request))
            results, sizes = self._run_pages(document, ocr_request, deadline, first,
                                             start_within_ms)
        finally:
            document.close()
        metrics.PAGES.labels("ok").inc(len(results))
        info = data_info(document.kind, sizes)
        if ocr_request.page_range is not None:
            info["pageIndices"] = document.page_indices
        if self.layout.of(ocr_request) is not None:
            return {"layoutParsingResults": results, "dataInfo": info}
        return {"ocrResults": results, "dataInfo": info}

    def _pages_cost(self, document: Document, ocr_request: OcrRequest) -> int:
        """Bytes of rendered pages this request holds at once (visualization doubles it)."""
        pages = min(self.config.page_window, len(document.page_indices))
        return pages * document.page_bytes * (2 if ocr_request.visualize else 1)

    def _run_pages(self, document: Document, ocr_request: OcrRequest, deadline: float,
                   first: bool = False, start_within_ms: int | None = None
                   ) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
        """Pages go to the inference queue as they are rendered and are encoded in order as
        they finish; at most OCR_PAGE_WINDOW rendered pages (queued, being inferred, or
        waiting to be encoded) exist at once, so memory does not grow with the page count.
        Rendering stops at the deadline. A page read from its text layer (textLayer "auto")
        skips the queue: its result is there at once."""
        visualize = bool(ocr_request.visualize)
        layout = self.layout.of(ocr_request)
        keep_image = visualize or layout is not None
        word_boxes = bool(ocr_request.pipeline_params.get("return_word_box"))
        marks = document.text_layer_marks
        window: deque[tuple[int, Future, Any, str | None]] = deque()
        results: list[dict[str, Any]] = []
        sizes: list[tuple[int, int]] = []
        pages = document.pages()
        try:
            while True:
                while window and (len(window) >= self.config.page_window
                                  or window[0][1].done()):
                    results.append(self._encode(*window.popleft(), visualize, deadline,
                                                layout))
                self._check_deadline(deadline, len(sizes) + 1)
                started = time.monotonic()
                image = next(pages, None)
                if image is None:
                    break
                if isinstance(image, TextLayerPage):
                    sizes.append((image.width, image.height))
                    future = Future()
                    future.set_result(TextLayerOutput(image.lines, word_boxes))
                    window.append((len(sizes) - 1, future, None, marks.get(len(sizes) - 1)))
                    del image, future
                    continue
                metrics.STAGE_SECONDS.labels("render").observe(time.monotonic() - started)
                tracing.record("render", started, time.monotonic(), page=len(sizes) + 1)
                sizes.append((int(image.shape[1]), int(image.shape[0])))
                future = self._submit(image, ocr_request.pipeline_params, deadline,
                                      len(sizes), first,
                                      start_within_ms if len(sizes) == 1 else None)
                window.append((len(sizes) - 1, future, image if keep_image else None,
                               marks.get(len(sizes) - 1)))
                del image, future
            while window:
                results.append(self._encode(*window.popleft(), visualize, deadline, layout))
        except BaseException as exc:
            for _, future, _, _ in window:
                future.cancel()
            if not (isinstance(exc, ApiError) and exc.status == 503):  # busy is not failed
                metrics.PAGES.labels("failed").inc(len(sizes) - len(results))
            raise
        finally:
            pages.close()
        return results, sizes

    def _check_deadline(self, deadline: float, page_number: int) -> None:
        if time.monotonic() >= deadline:
            raise self._deadline_error(deadline, page_number)

    def _deadline_error(self, deadline: float, page_number: int) -> ApiError:
        return ApiError(504, f"OCR did not finish within the request's deadline (page "
                             f"{page_number} pending; the deadline is the sooner of "
                             f"X-Deadline-Ms and {self.config.request_timeout_s:g} s): send "
                             "fewer pages per request")

    def _submit(self, image, params, deadline: float, page_number: int,
                first: bool = False, start_within_ms: int | None = None) -> Future:
        start_within_s = None if start_within_ms is None else start_within_ms / 1000.0
        try:
            return self.batcher.submit(image, params, deadline, first=first,
                                       start_within_s=start_within_s)
        except StartsLater as exc:
            raise self.refuse.late(exc, start_within_ms) from None
        except EngineNotReady as exc:
            raise ApiError(503, str(exc), {"Retry-After": str(self.config.retry_after_s)})
        except DeadlineExceeded:
            raise self._deadline_error(deadline, page_number) from None

    def _encode(self, index: int, future: Future, input_image, text_layer: str | None,
                visualize: bool, deadline: float, layout=None) -> dict[str, Any]:
        try:
            output = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except (FutureTimeout, DeadlineExceeded):
            raise self._deadline_error(deadline, index + 1) from None
        except ApiError:
            raise
        except Exception as exc:
            log.error("inference failed on page %d: %s", index + 1, exc)
            raise ApiError(500, f"OCR failed on page {index + 1}: {type(exc).__name__}") \
                from None
        started = time.monotonic()
        if layout is not None:  # /layout-parsing: regions, tables, Markdown (services/layout)
            with tracing.span("layout", page=index + 1):
                encoded = self.layout.page(input_image, output, layout, index + 1)
            metrics.STAGE_SECONDS.labels("layout").observe(time.monotonic() - started)
            return encoded
        with tracing.span("encode", page=index + 1):
            encoded = encode_page(output, input_image, visualize, text_layer)
        metrics.STAGE_SECONDS.labels("encode").observe(time.monotonic() - started)
        return encoded

    def handle(self, read_fields: Callable[[], tuple[Mapping[str, Any], bytes | None]],
               log_id_hook: Callable[[str], None] = lambda _: None,
               deadline_ms: int | None = None, content_length: int | None = None,
               first: bool = False, start_within_ms: int | None = None,
               within_target: bool = False, layout: bool = False) -> dict[str, Any]:
        """The whole request: admission first (so an overloaded worker refuses before it even
        reads the body), then decode_request -> predict -> envelope. The deadline is the
        sooner of OCR_REQUEST_TIMEOUT_S and the caller's X-Deadline-Ms, from arrival;
        `start_within_ms`: refused at once unless its pages would start that soon;
        `within_target`: refused at once when this worker already holds its target's pages
        (services/ocr_worker/refusal.py)."""
        arrived = time.monotonic()
        timeout_s = self.config.request_timeout_s
        if deadline_ms is not None:
            timeout_s = min(timeout_s, deadline_ms / 1000.0)
        deadline = arrived + timeout_s
        self.refuse.unless_ready()
        self._check_deadline(deadline, 1)
        if start_within_ms is not None:
            self.refuse.if_late(start_within_ms, first)
        body_cost = 2 * (content_length or 0)  # the body, then the file decoded from it
        with self.refuse.admit(within_target, first), \
                self.memory.reserve(body_cost) as reservation:
            metrics.INFLIGHT.inc()
            try:
                with tracing.span("decode"):
                    fields, file_bytes = read_fields()
                    ocr_request = self.decode_request(fields, file_bytes, layout)
                del fields, file_bytes  # the request keeps the decoded file only
                reservation.grow_to(max(reservation.nbytes, 2 * len(ocr_request.file_bytes
                                                                     or b"")))
                log_id_hook(ocr_request.log_id)
                return envelope.success(ocr_request.log_id,
                                        self.predict(ocr_request, deadline, reservation,
                                                     first, start_within_ms))
            finally:
                metrics.INFLIGHT.dec()

    def shutdown(self, timeout: float | None = None) -> None:
        self.admission.draining = True
        metrics.READY.set(0)
        self.batcher.stop(timeout)
