"""What the worker changes in PaddleOCR's pipeline after building it, each change measured
(docs/benchmarks.md "Engine speed") and shown not to alter the text on the accuracy corpus
(`make bench-accuracy`):

- the backend: `OCR_BACKEND=auto` resolves to onnxruntime everywhere (the images' backend);
  `openvino` swaps the sessions (services/ocr_worker/openvino_backend.py);
- onnxruntime's CPU arena (`OCR_ORT_CPU_ARENA`, on): shrunk after each large input
  (`ArenaShrink`), so it speeds the recogniser's many small calls without holding the largest
  page's activations;
- CTC decoding: PaddleX's CTCLabelDecode copies the recognition output (batch x time x 6906
  classes) and reads it twice (argmax, then max); ours reads it once more after the argmax
  only at the chosen classes. Same argmax, same probabilities, so the same text and scores.

No paddle/paddlex import at module level: the worker imports this before the engine loads."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .config import WorkerConfig

log = logging.getLogger("ocr_worker.engine")


def resolve_backend(config: WorkerConfig) -> str:
    """The backend `auto` stands for: onnxruntime, on every machine, so that `make run`, the
    images and the manifests run the engine their memory limits were measured on. OpenVINO
    bf16 is ~1.7x faster on a CPU with bf16 but holds ~1.1 GB after large scans where
    onnxruntime holds ~0.4 GB (issue 26; docs/benchmarks.md "Engine speed"): it is a choice, not a
    default."""
    return "onnxruntime" if config.backend == "auto" else config.backend


def paddle_engine_name(backend: str) -> str:
    """PaddleX's engine for a backend: OpenVINO replaces onnxruntime's sessions afterwards."""
    return "onnxruntime" if backend == "openvino" else backend


def apply(paddlex_pipeline, config: WorkerConfig, backend: str) -> dict[str, str]:
    """Tune a freshly built PaddleX OCR pipeline; returns what to add to the engine's info."""
    info = {"backend": backend, "rec_batch_size": str(config.rec_batch_size)}
    inner = getattr(paddlex_pipeline, "_pipeline", paddlex_pipeline)
    if install_fast_ctc(inner.text_rec_model):
        info["ctc_decode"] = "fast"
    if backend == "openvino":
        from . import openvino_backend

        info["precision"] = openvino_backend.install(paddlex_pipeline, config.ov_precision,
                                                     config.threads)
    elif backend == "onnxruntime":
        info["precision"] = "fp32"
        if config.ort_cpu_arena and config.device == "cpu":
            for runner in runners(inner):
                runner.session = ArenaShrink(runner.session)
            info["cpu_arena"] = "shrunk after large inputs"
    return info


# After a call on at least this many input values, the session's CPU arena gives back what the
# call no longer holds: a detector input of about 2.3 megapixels, so that A4 and Letter pages
# at 150 dpi (2.2 MP) keep theirs for the next page, and 200-dpi pages, scans, photos and long
# pages at the detector's cap (2.6-2.8 MP) give theirs back: paged in again after every page
# by workers side by side, the buffers cost a fifth of their pages/s (docs/benchmarks.md
# "Engine speed")
SHRINK_MIN_VALUES = 7_000_000


class ArenaShrink:
    """An onnxruntime session whose CPU arena is shrunk after each large input. The arena
    keeps a page's activations allocated for the next call: no malloc, free and page faults
    of hundreds of MB per page, but it grows to the largest input seen and never shrinks by
    itself (2.5 GB held after rounds of large scans). Shrinking after the large inputs only
    keeps the recogniser's batches and an ordinary page's detector buffers on the arena, and
    gives a large page's back. PaddleX's runner calls `session.run(output_names, feeds)` with
    no RunOptions: they are added here."""

    def __init__(self, session, min_values: float | None = None):
        import onnxruntime as ort

        self._session = session
        self._min_values = SHRINK_MIN_VALUES if min_values is None else min_values
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run(self, output_names, feeds, run_options=None):
        if run_options is None and max(np.size(v) for v in feeds.values()) >= self._min_values:
            run_options = self._shrink
        return self._session.run(output_names, feeds, run_options)

    def __getattr__(self, name):  # get_inputs(), get_outputs() and the rest: the session's
        return getattr(self._session, name)


def runners(inner) -> list:
    """The detection and recognition models' onnxruntime runners that have a session."""
    models = (getattr(inner, name, None) for name in ("text_det_model", "text_rec_model"))
    return [m.runner for m in models if hasattr(getattr(m, "runner", None), "session")]


def ctc_best_path(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(class index, its probability) per time step: argmax, then a gather of the winners
    instead of a second full pass with max()."""
    index = logits.argmax(axis=-1)
    return index, np.take_along_axis(logits, index[..., None], axis=-1)[..., 0]


def install_fast_ctc(rec_model) -> bool:
    """Give the recognition model's CTCLabelDecode our __call__ (everything else, dictionary
    and decode(), stays PaddleX's). Left alone if the post-processor is another class."""
    post_op = getattr(rec_model, "post_op", None)
    base = type(post_op)
    if base.__name__ != "CTCLabelDecode":
        log.warning("recognition post-processor is %s, not CTCLabelDecode: left as it is",
                    base.__name__)
        return False
    post_op.__class__ = _fast_ctc_class(base)
    return True


_FAST_CLASSES: dict[type, type] = {}


def _fast_ctc_class(base: type) -> type:
    if base not in _FAST_CLASSES:
        def __call__(self, pred, return_word_box=False, **kwargs):
            if return_word_box:  # word boxes need PaddleX's extra bookkeeping
                return base.__call__(self, pred, return_word_box=True, **kwargs)
            index, prob = ctc_best_path(np.asarray(pred[0]))
            decoded = self.decode(index, prob, is_remove_duplicate=True)
            return [text for text, _ in decoded], [score for _, score in decoded]

        _FAST_CLASSES[base] = type("FastCTCLabelDecode", (base,), {"__call__": __call__})
    return _FAST_CLASSES[base]
