"""OCR_BACKEND=openvino: PaddleOCR's own pipeline (pre- and post-processing unchanged) with the
onnxruntime session of each model swapped for an OpenVINO compiled model of the same ONNX file.

Why a swap and not a PaddleX engine: paddlex 3.7 builds every model's session in
`paddlex/inference/models/runners/onnxruntime_runner.py` (`ONNXRuntimeRunner._create_session`,
an `onnxruntime.InferenceSession`), and the runner only ever calls
`self.session.run(output_names, feeds)`. PaddleX's own OpenVINO route is its "hpi" engine,
which needs the `ultra-infer` plugin that is not on PyPI. So the pipeline is built as usual on
onnxruntime, then `install()` replaces `runner.session` of the detection and recognition
models with `OpenVINOSession`, which has the same `run()`. This is the only module that
imports openvino.

Precision: `fp32` is exact (OpenVINO's CPU plugin otherwise defaults to bf16 on CPUs with
AMX); `bf16` runs matmuls/convolutions in bfloat16 where the CPU has it (AMX or AVX-512 BF16,
reported as `BF16` in the CPU's OPTIMIZATION_CAPABILITIES); `auto` is bf16 where the CPU has
it, else fp32."""

from __future__ import annotations

import logging
from typing import Any, Iterable, Sequence

import numpy as np

from . import engine_tuning

log = logging.getLogger("ocr_worker.openvino")

PRECISIONS = ("fp32", "bf16", "auto")
_HINTS = {"fp32": "f32", "bf16": "bf16"}
# After an inference on at least this many input values (a detector input of a megapixel, the
# worker's OCR_TRIM_MIN_PIXELS), the compiled model's intermediate buffers are released
RELEASE_MIN_VALUES = 3_000_000


def resolve_precision(setting: str, capabilities: Iterable[str]) -> str:
    """fp32 or bf16 from the setting and the CPU's OPTIMIZATION_CAPABILITIES. Asking for bf16
    on a CPU without it is an error: OpenVINO would silently run fp32 and the figures would
    lie."""
    if setting not in PRECISIONS:
        raise ValueError(f"precision {setting!r}: expected one of {', '.join(PRECISIONS)}")
    has_bf16 = "BF16" in set(capabilities)
    if setting == "auto":
        return "bf16" if has_bf16 else "fp32"
    if setting == "bf16" and not has_bf16:
        raise ValueError("OCR_OV_PRECISION=bf16: this CPU has no bf16 support (no BF16 in "
                         "OpenVINO's OPTIMIZATION_CAPABILITIES); use fp32 or auto")
    return setting


def cpu_capabilities() -> list[str]:
    import openvino as ov

    return list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def cpu_description() -> dict[str, Any]:
    """What OpenVINO sees of this CPU (for reports and /readyz)."""
    import openvino as ov

    core = ov.Core()
    return {"openvino": ov.__version__,
            "cpu": core.get_property("CPU", "FULL_DEVICE_NAME"),
            "capabilities": list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))}


class OpenVINOSession:
    """One ONNX model compiled for the CPU, with onnxruntime's `InferenceSession.run()`
    signature (output names, {input name: array}) -> list of arrays. Called by one thread (the
    worker's inference thread), so one infer request is reused.

    OpenVINO's CPU plugin keeps a model's intermediate buffers at the largest input it has
    seen: after large scans a worker held ~2 GB where onnxruntime holds ~0.4 GB. Releasing
    them after each large input (re-allocated by the next: milliseconds against seconds of
    inference) held it at ~1.1 GB, at about the same speed (issue 26)."""

    def __init__(self, model_path: str, precision: str, threads: int, core=None):
        import openvino as ov

        self.precision = precision
        core = core or ov.Core()
        properties = {
            "INFERENCE_PRECISION_HINT": _HINTS[precision],
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
            # several worker processes share the machine's cores: pinning each one's threads
            # would put them all on the same first cores
            "ENABLE_CPU_PINNING": False,
        }
        self._compiled = core.compile_model(core.read_model(model_path), "CPU", properties)
        self._request = self._compiled.create_infer_request()
        self._outputs = {port.any_name: port for port in self._compiled.outputs}

    def run(self, output_names: Sequence[str] | None, feeds: dict[str, np.ndarray]
            ) -> list[np.ndarray]:
        results = self._request.infer(feeds)
        names = output_names or list(self._outputs)
        outputs = [np.array(results[self._outputs[name]], copy=True) for name in names]
        if max(np.size(value) for value in feeds.values()) >= RELEASE_MIN_VALUES:
            self._compiled.release_memory()
        return outputs


def _runners(paddlex_pipeline) -> list[Any]:
    """The onnxruntime runners of the OCR pipeline's detection and recognition models
    (engine_tuning.runners), both of them or an error."""
    inner = getattr(paddlex_pipeline, "_pipeline", paddlex_pipeline)
    found = [runner for runner in engine_tuning.runners(inner) if hasattr(runner, "model_dir")]
    if len(found) != 2:
        raise RuntimeError("paddlex's OCR pipeline has no onnxruntime runner for its detection "
                           "and recognition models: this paddlex version is not supported by "
                           "OCR_BACKEND=openvino")
    return found


def install(paddlex_pipeline, precision_setting: str, threads: int) -> str:
    """Swap the sessions of a PaddleX OCR pipeline built on onnxruntime; returns the precision
    in use (fp32 or bf16)."""
    import openvino as ov

    core = ov.Core()
    precision = resolve_precision(precision_setting,
                                  core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    for runner in _runners(paddlex_pipeline):
        model_path = str(runner._get_model_path())
        runner.session = OpenVINOSession(model_path, precision, threads, core)
        log.info("openvino session", extra={"model": model_path, "precision": precision})
    return precision
