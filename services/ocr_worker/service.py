"""OcrService: one /ocr request's stages in order — decode the request, admit it, render its
pages into the inference queue, wait for the results, encode the PaddleX response. Holds the
engine, the batcher and admission control of this process. No Flask here."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Any, Callable, Mapping

from services.ocr_api import envelope
from services.ocr_api.errors import ApiError, unprocessable
from services.ocr_api.request import OcrRequest, parse_ocr_request
from services.ocr_api.url_input import make_url_fetcher

from . import metrics
from .admission import Admission
from .batcher import EngineNotReady, InferenceBatcher
from .config import WorkerConfig
from .decode import DecodeLimits, open_document
from .encode import data_info, encode_page
from .engine import Engine, create_engine

log = logging.getLogger("ocr_worker")


class OcrService:
    def __init__(self, config: WorkerConfig, engine: Engine | None = None):
        self.config = config
        self.engine = engine or create_engine(config)
        self.admission = Admission(config.queue_size, config.retry_after_s)
        self.batcher = InferenceBatcher(
            self.engine, queue_pages=config.page_buffer, max_batch=config.max_batch,
            batch_wait_s=config.batch_wait_ms / 1000.0, warmup=config.warmup,
            observe=metrics.observe_batcher)
        self.limits = DecodeLimits(max_pages=config.max_pages, max_pixels=config.max_pixels,
                                   pdf_dpi=config.pdf_dpi)
        self.fetch_url = (make_url_fetcher(config.max_bytes, config.url_timeout_s)
                          if config.allow_url_input else None)
        self.visualize_by_default = (config.visualize_default
                                     and self.engine.unsupported({}, True) is None)
        metrics.set_engine_info(self.engine.info)
        metrics.QUEUE_CAPACITY.set(config.queue_size)

    def start(self) -> None:
        self.batcher.start()

    def readiness(self) -> tuple[bool, str]:
        if self.admission.draining:
            return False, "draining: shutting down"
        if self.batcher.load_error:
            return False, self.batcher.load_error
        if not self.batcher.ready.is_set():
            return False, "the model is loading"
        return True, "ready"

    # ---- stages ------------------------------------------------------------------------------
    def decode_request(self, fields: Mapping[str, Any], file_bytes: bytes | None) -> OcrRequest:
        started = time.monotonic()
        ocr_request = parse_ocr_request(fields, max_bytes=self.config.max_bytes,
                                        file_bytes=file_bytes, fetch_url=self.fetch_url)
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

    def predict(self, ocr_request: OcrRequest) -> dict[str, Any]:
        """Render, infer and encode one admitted request; returns the `result` object."""
        deadline = time.monotonic() + self.config.request_timeout_s
        document = open_document(ocr_request, self.limits)
        futures: list[Future] = []
        inputs = []
        sizes: list[tuple[int, int]] = []
        visualize = bool(ocr_request.visualize)
        try:
            pages = document.pages()
            while True:
                started = time.monotonic()
                image = next(pages, None)
                if image is None:
                    break
                metrics.STAGE_SECONDS.labels("render").observe(time.monotonic() - started)
                sizes.append((int(image.shape[1]), int(image.shape[0])))
                inputs.append(image if visualize else None)
                futures.append(self._submit(image, ocr_request.pipeline_params))
            results = [self._encode(index, future, inputs[index], visualize, deadline)
                       for index, future in enumerate(futures)]
        except BaseException:
            for future in futures:
                future.cancel()
            metrics.PAGES.labels("failed").inc(len(futures))
            raise
        finally:
            document.close()
        metrics.PAGES.labels("ok").inc(len(results))
        info = data_info(document.kind, sizes)
        if ocr_request.page_range is not None:
            info["pageIndices"] = document.page_indices
        return {"ocrResults": results, "dataInfo": info}

    def _submit(self, image, params) -> Future:
        try:
            return self.batcher.submit(image, params)
        except EngineNotReady as exc:
            raise ApiError(503, str(exc), {"Retry-After": str(self.config.retry_after_s)})

    def _encode(self, index: int, future: Future, input_image, visualize: bool,
                deadline: float) -> dict[str, Any]:
        try:
            output = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise ApiError(504, f"OCR did not finish within {self.config.request_timeout_s:g} s "
                                f"(page {index + 1} pending): send fewer pages per request") \
                from None
        except ApiError:
            raise
        except Exception as exc:
            log.error("inference failed on page %d: %s", index + 1, exc)
            raise ApiError(500, f"OCR failed on page {index + 1}: {type(exc).__name__}") \
                from None
        started = time.monotonic()
        encoded = encode_page(output, input_image, visualize)
        metrics.STAGE_SECONDS.labels("encode").observe(time.monotonic() - started)
        return encoded

    def handle(self, read_fields: Callable[[], tuple[Mapping[str, Any], bytes | None]],
               log_id_hook: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
        """The whole request: admission first (so an overloaded worker refuses before it even
        reads the body), then decode_request -> predict -> envelope."""
        self._refuse_unless_ready()
        with self.admission.admit():
            metrics.INFLIGHT.inc()
            try:
                fields, file_bytes = read_fields()
                ocr_request = self.decode_request(fields, file_bytes)
                log_id_hook(ocr_request.log_id)
                return envelope.success(ocr_request.log_id, self.predict(ocr_request))
            finally:
                metrics.INFLIGHT.dec()

    def _refuse_unless_ready(self) -> None:
        if not self.batcher.ready.is_set():
            message = self.batcher.load_error or "The model is still loading: retry shortly"
            raise ApiError(503, message, {"Retry-After": str(self.config.retry_after_s)})

    def shutdown(self, timeout: float | None = None) -> None:
        self.admission.draining = True
        metrics.READY.set(0)
        self.batcher.stop(timeout)
