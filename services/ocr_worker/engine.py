"""OCR engines behind one small protocol: the real PaddleOCR pipeline (the only code that imports
paddleocr) and `sim`, a stand-in with a fixed per-page service time for fleet benchmarks.

An engine is created and called by exactly one thread (the batcher's inference thread):
PaddleOCR pipelines are not thread-safe."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from . import engine_tuning
from .config import WorkerConfig


class PageOutput(Protocol):
    """One page's engine output; converted to JSON by the request thread, not the engine's."""

    def result_json(self) -> dict[str, Any]: ...

    def visual_image(self) -> np.ndarray | None: ...


class Engine(Protocol):
    info: dict[str, str]

    def load(self) -> None: ...

    def unsupported(self, params: dict[str, Any], visualize: bool) -> str | None:
        """Why these pipeline parameters (or visualization) cannot be served here, or None."""

    def predict(self, images: list[np.ndarray], params: dict[str, Any]) -> list[PageOutput]: ...


def configure_offline_environment(config: WorkerConfig) -> None:
    """Make PaddleX/onnxruntime run with no network access and bounded threads; must run before
    paddleocr is imported."""
    os.makedirs(config.cache_dir, exist_ok=True)
    os.environ["PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK"] = "True"
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"
    os.environ.setdefault("PADDLE_PDX_CACHE_HOME", config.cache_dir)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, str(config.threads))
    if config.vis_font:
        os.environ.setdefault("PADDLE_PDX_LOCAL_FONT_FILE_PATH", config.vis_font)


def onnxruntime_engine_config(config: WorkerConfig) -> dict[str, Any]:
    """PaddleX's `engine_config` for onnxruntime (its ONNXRuntimeRunnerConfig: these keys
    become SessionOptions attributes). The CPU arena is on (OCR_ORT_CPU_ARENA), and shrunk
    after each large input (engine_tuning.ArenaShrink): with PaddleOCR's dynamic input shapes
    it would otherwise grow to the largest page seen and never shrink (docs/operations.md
    "Memory"). On a GPU the CUDA arena grows by what a page needs, not to the next power of
    two."""
    engine_config: dict[str, Any] = {"intra_op_num_threads": config.threads,
                                     "inter_op_num_threads": 1,
                                     "enable_cpu_mem_arena": config.ort_cpu_arena}
    if config.device.startswith("gpu"):
        engine_config["provider_options"] = {"arena_extend_strategy": "kSameAsRequested"}
    return engine_config


# long side / short side beyond which a page is long: a little over A4's 1.41, so that an A4
# scan cropped a little long is capped like any other
LONG_PAGE = 1.5


def tune_pipeline_memory(pipeline: Any, config: WorkerConfig) -> Any:
    """The detector's input cap (`OCR_DET_MAX_SIDE`, PaddleX's `text_det_max_side_limit`): a
    page's long side is scaled down to it before detection; the recogniser still reads each
    line from the page's own pixels. 2000 here, where PaddleX ships 4000: a 150-dpi A4 page
    (1754 px) is detected at its own size, a 300-dpi scan at about half (a third of the
    detector's pixels, a tenth of a page's peak memory) at the same or a lower CER
    (docs/benchmarks.md, "Engine speed"). A page longer than LONG_PAGE gets a longer side
    (`detector_side_limit`), set for each engine call. PaddleX's notice of each such
    resize is dropped from its log. Returns the PaddleX pipeline that holds the cap, or None."""
    inner = getattr(getattr(pipeline, "paddlex_pipeline", None), "_pipeline", None)
    paddlex_log = logging.getLogger("paddlex")
    if not any(isinstance(f, DropResizeNotice) for f in paddlex_log.filters):
        paddlex_log.addFilter(DropResizeNotice())
    if inner is None or not hasattr(inner, "text_det_max_side_limit"):
        return None
    inner.text_det_max_side_limit = config.det_max_side
    return inner


def detector_side_limit(height: int, width: int, max_side: int) -> int:
    """The detector's long-side cap for a page of this size: `max_side` up to LONG_PAGE (a
    square page, Letter and A4 included); for a longer, narrower page (a till receipt, a
    scrolled screenshot) the long side that gives it the area of a LONG_PAGE page at
    `max_side`. Its text then keeps about an A4 page's resolution instead of shrinking to a
    sliver, for the same time and memory: those follow the area."""
    budget = max_side * max_side / LONG_PAGE
    return max(max_side, int(max(height, width) * math.sqrt(budget / max(1, height * width))))


class DropResizeNotice(logging.Filter):
    """PaddleX warns on every page whose long side is over the detector's cap, which at the
    worker's cap is every scan: the setting doing its job, not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Resized image size")


# Pipeline switches that need a model this worker may not have loaded.
_OPTIONAL_MODULES = {
    "use_doc_orientation_classify": "useDocOrientationClassify",
    "use_doc_unwarping": "useDocUnwarping",
    "use_textline_orientation": "useTextlineOrientation",
}


class PaddleOCREngine:
    """paddleocr 3.x `PaddleOCR` on local model directories, optional modules off."""

    def __init__(self, config: WorkerConfig):
        self.config = config
        det_name, det_dir, rec_name, rec_dir = config.model_paths()
        self.model_paths = dict(det_name=det_name, det_dir=det_dir,
                                rec_name=rec_name, rec_dir=rec_dir)
        self.backend = engine_tuning.resolve_backend(config)  # what `auto` means here
        self.info = {
            "engine": "paddleocr",
            "backend": self.backend,
            "device": config.device,
            "det_model": det_name,
            "rec_model": rec_name,
            "threads": str(config.threads),
        }
        self._pipeline = None
        self._capped: Any = None  # the PaddleX pipeline holding the detector's cap

    def check_models(self) -> None:
        for key in ("det_dir", "rec_dir"):
            path = self.model_paths[key]
            if not os.path.isdir(path):
                raise FileNotFoundError(
                    f"model directory {path} does not exist: run `make models` or set "
                    f"OCR_MODEL_DIR / OCR_{key[:3].upper()}_MODEL_DIR")

    def load(self) -> None:
        self.check_models()
        configure_offline_environment(self.config)
        from paddleocr import PaddleOCR  # heavy; imported in the worker process, after fork

        kwargs: dict[str, Any] = dict(
            device=self.config.device,
            engine=engine_tuning.paddle_engine_name(self.backend),
            text_detection_model_name=self.model_paths["det_name"],
            text_detection_model_dir=self.model_paths["det_dir"],
            text_recognition_model_name=self.model_paths["rec_name"],
            text_recognition_model_dir=self.model_paths["rec_dir"],
            use_doc_orientation_classify=False,
            use_doc_unwarping=False,
            use_textline_orientation=False,
            text_recognition_batch_size=self.config.rec_batch_size,
        )
        if kwargs["engine"] == "onnxruntime":
            kwargs["engine_config"] = onnxruntime_engine_config(self.config)
        else:
            kwargs["cpu_threads"] = self.config.threads
        self._pipeline = PaddleOCR(**kwargs)
        self._capped = tune_pipeline_memory(self._pipeline, self.config)
        self.info.update(engine_tuning.apply(self._pipeline.paddlex_pipeline, self.config,
                                             self.backend))

    def unsupported(self, params: dict[str, Any], visualize: bool) -> str | None:
        for kwarg, api_name in _OPTIONAL_MODULES.items():
            if params.get(kwarg):
                return (f"{api_name} is not available on this server: its model is not "
                        "loaded (this deployment runs text detection + recognition only); "
                        f"send {api_name}: false or leave it out")
        if visualize and not self.config.vis_font:
            return "visualize needs a font file: set OCR_VIS_FONT on the server"
        return None

    def predict(self, images: list[np.ndarray], params: dict[str, Any]) -> list[PageOutput]:
        if self._capped is not None:  # one call's pages share it: the smallest they need
            self._capped.text_det_max_side_limit = min((detector_side_limit(
                *image.shape[:2], self.config.det_max_side) for image in images),
                default=self.config.det_max_side)
        results = self._pipeline.predict(images, **params)
        return [PaddlePageOutput(result) for result in results]


class PaddlePageOutput:
    def __init__(self, result):
        self._result = result

    def result_json(self) -> dict[str, Any]:
        return self._result.json["res"]

    def visual_image(self) -> np.ndarray | None:
        image = self._result.img.get("ocr_res_img")
        if image is None:
            return None
        array = np.asarray(image.convert("RGB"))
        return np.ascontiguousarray(array[:, :, ::-1])  # RGB -> BGR


SIM_MARK = "[simulated]"


class SimEngine:
    """Sleeps a configured service time per page and returns deterministic text marked
    as simulated. Only for measuring the fleet; never a default. With OCR_SIM_PAGE_PIXELS, an
    image smaller than a full page takes its share of the time, as the real engine's time
    follows the pixels (a one-line image: about 2 % of a dense page's). OCR_SIM_JITTER_MS
    varies each page's time by up to that much either way (an image: its share of it), drawn
    apart in each process, so that workers' pages do not end in step."""

    def __init__(self, config: WorkerConfig):
        self.page_s = config.sim_page_ms / 1000.0
        self.page_pixels = config.sim_page_pixels
        self.jitter_s = config.sim_jitter_ms / 1000.0
        self.info = {"engine": "sim", "backend": "none", "device": "none",
                     "det_model": "none", "rec_model": "none",
                     "page_ms": str(config.sim_page_ms)}
        self.load_s = config.sim_load_ms / 1000.0
        self._random = random.Random()

    def load(self) -> None:
        time.sleep(self.load_s)  # a model's load time, for readiness and recycling tests

    def unsupported(self, params: dict[str, Any], visualize: bool) -> str | None:
        return None

    def predict(self, images: list[np.ndarray], params: dict[str, Any]) -> list[PageOutput]:
        outputs = []
        for image in images:
            jitter = self._random.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0
            time.sleep(max(0.0, (self.page_s + jitter) * self.share_of_page(image)))
            outputs.append(SimPageOutput(image))
        return outputs

    def share_of_page(self, image: np.ndarray) -> float:
        if not self.page_pixels:
            return 1.0
        return min(1.0, image.shape[0] * image.shape[1] / self.page_pixels)


@dataclass
class SimPageOutput:
    image: np.ndarray

    def result_json(self) -> dict[str, Any]:
        height, width = self.image.shape[:2]
        digest = hashlib.sha1(np.ascontiguousarray(self.image[::16, ::16]).tobytes()).hexdigest()
        box = [0, 0, width - 1, height - 1]
        poly = [[0, 0], [width - 1, 0], [width - 1, height - 1], [0, height - 1]]
        return {
            "model_settings": {"simulated": True},
            "dt_polys": [poly],
            "rec_texts": [f"{SIM_MARK} page {width}x{height} {digest[:12]}"],
            "rec_scores": [1.0],
            "rec_polys": [poly],
            "rec_boxes": [box],
        }

    def visual_image(self) -> np.ndarray | None:
        return None


def create_engine(config: WorkerConfig) -> Engine:
    if config.engine == "sim":
        return SimEngine(config)
    return PaddleOCREngine(config)
