"""Where a worker's memory goes on large pages (docs/operations.md, "Memory"): the real engine
on onnxruntime (and OpenVINO bf16 beside it), 1 thread, in a fresh process per variant
(VARIANTS: allocator settings, backends), ten large generated pages one after another, per
page the RSS after it (steady) and the most during it (peak), and the CPU seconds of the ten;
then one 300-dpi A4 page's peak split between the detector's activations and the pipeline's
numpy arrays, and OCR_DET_MAX_SIDE's trade (peak and word recall per cap).

Run: python -m loadtest.memory_sources [variant ...]; writes memory_sources.json. Not part of
`make bench`."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from loadtest import procstats, report

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"

VARIANTS: dict[str, dict[str, Any]] = {
    "arena on (onnxruntime default)": {"arena": True},
    "arena on + shrinkage run option": {"arena": True, "shrink": True},
    "arena kSameAsRequested (env allocator)": {"arena": True, "same_as_requested": True},
    "arena off": {"arena": False},
    "arena off + MALLOC_ARENA_MAX=2": {"arena": False, "env": {"MALLOC_ARENA_MAX": "2"}},
    "arena on + jemalloc": {"arena": True, "env": {"LD_PRELOAD": JEMALLOC}},
    "arena off + jemalloc": {"arena": False, "env": {"LD_PRELOAD": JEMALLOC}},
    "arena off + malloc_trim (worker default)": {"arena": False, "trim": True},
    "OpenVINO bf16, buffers released after large inputs (OCR_BACKEND=openvino)":
        {"arena": False, "trim": True, "backend": "openvino"},
    "OpenVINO bf16, buffers never released": {"arena": False, "trim": True,
                                              "backend": "openvino", "keep_buffers": True},
}


def _rss_mib() -> float:
    return procstats.rss_kib(os.getpid()) / 1024


def _peak_mib() -> float:
    return procstats.peak_rss_kib(os.getpid()) / 1024


def _reset_peak() -> None:
    procstats.reset_peak_rss(os.getpid())


def _engine(arena: bool, backend: str = "onnxruntime"):
    from services.ocr_worker.config import WorkerConfig
    from services.ocr_worker.engine import PaddleOCREngine

    engine = PaddleOCREngine(WorkerConfig(ort_cpu_arena=arena, warmup=False, backend=backend))
    engine.load()
    return engine


def _runners(engine) -> list:
    inner = engine._pipeline.paddlex_pipeline._pipeline
    return [inner.text_det_model.runner, inner.text_rec_model.runner]


class _RunWithOptions:
    """A session whose run() always passes these RunOptions (PaddleX's runner passes none)."""

    def __init__(self, session, run_options):
        self._session, self._run_options = session, run_options

    def run(self, output_names, feeds, run_options=None):
        return self._session.run(output_names, feeds, run_options or self._run_options)

    def __getattr__(self, name):
        return getattr(self._session, name)


def _apply(engine, variant: dict[str, Any]) -> None:
    import onnxruntime as ort

    if variant.get("same_as_requested"):
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                 ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 1, -1, -1))
        for runner in _runners(engine):
            options = runner._build_session_options()
            options.add_session_config_entry("session.use_env_allocators", "1")
            runner.session = ort.InferenceSession(str(runner._get_model_path()),
                                                  sess_options=options,
                                                  providers=["CPUExecutionProvider"])
    if variant.get("shrink"):
        run_options = ort.RunOptions()
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        for runner in _runners(engine):
            runner.session = _RunWithOptions(runner.session, run_options)


def child(name: str, pages_dir: Path) -> dict[str, Any]:
    """One variant, in this (fresh) process."""
    import cv2
    import numpy as np

    variant = VARIANTS[name]
    if variant.get("keep_buffers"):  # OpenVINO keeps its buffers at the largest input seen
        from services.ocr_worker import openvino_backend
        openvino_backend.RELEASE_MIN_VALUES = float("inf")
    engine = _engine(variant["arena"], variant.get("backend", "onnxruntime"))
    _apply(engine, variant)
    engine.predict([np.full((96, 480, 3), 255, np.uint8)], {})
    libc = ctypes.CDLL("libc.so.6")
    out: dict[str, Any] = {"variant": name, "engine": engine.info,
                           "after_load_mib": _rss_mib(), "pages": []}
    started = time.process_time()
    for path in sorted(pages_dir.iterdir()):
        data = path.read_bytes()
        _reset_peak()
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        outputs = engine.predict([image], {})
        texts = len(outputs[0].result_json()["rec_texts"])
        del image, outputs
        gc.collect()
        if variant.get("trim"):
            libc.malloc_trim(0)
        out["pages"].append({"page": path.name, "texts": texts, "peak_mib": _peak_mib(),
                             "steady_mib": _rss_mib()})
    out["cpu_s"] = round(time.process_time() - started, 1)
    out["steady_end_mib"] = out["pages"][-1]["steady_mib"]
    out["steady_max_mib"] = max(p["steady_mib"] for p in out["pages"])
    out["peak_max_mib"] = max(p["peak_mib"] for p in out["pages"])
    return out


def peak_split(pages_dir: Path) -> dict[str, Any]:
    """One 300-dpi A4 page: the detector's activations alone vs the pipeline's numpy arrays."""
    import cv2
    import numpy as np
    import onnxruntime as ort

    engine = _engine(False)
    page = next(p for p in sorted(pages_dir.iterdir()) if "dense" in p.name)
    image = cv2.imdecode(np.frombuffer(page.read_bytes(), np.uint8), cv2.IMREAD_COLOR)
    runner = _runners(engine)[0]
    seen: dict[str, Any] = {}
    original = runner.__class__.__call__

    def spy(self, x=None, **kwargs):
        if self is runner:  # the detector's runner (the recognizer's shares the class)
            seen["input_shape"] = list(x[0].shape)
            seen["numpy_before_det_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        return original(self, x=x, **kwargs)

    runner.__class__.__call__ = spy
    try:
        gc.collect()
        tracemalloc.start()
        engine.predict([image], {})
        seen["numpy_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    finally:
        runner.__class__.__call__ = original
    shape = seen["input_shape"]
    results = {"page": page.name, "engine": engine.info,
               "decoded_page_mib": image.nbytes / 2**20, **seen}
    for arena in (True, False):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.enable_cpu_mem_arena = arena
        session = ort.InferenceSession(str(runner._get_model_path()), options,
                                       providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
        gc.collect()
        base = _rss_mib()
        _reset_peak()
        session.run(None, {session.get_inputs()[0].name: x})
        key = "arena_on" if arena else "arena_off"
        results[f"det_run_peak_over_input_mib_{key}"] = _peak_mib() - base
        results[f"det_run_retained_mib_{key}"] = _rss_mib() - base
        del session, x
    return results


def dense_words(seed: int, dpi: int) -> list[str]:
    """The words samples/documents.dense_page(seed, dpi) prints (the ground truth)."""
    from samples import documents

    size = max(12, int(dpi * 0.15))
    height = int(11.69 * dpi)
    lines = documents.english_lines(int((height - 2 * size * 3) / (size * 1.5)), seed, 9)
    return " ".join(lines).split()


def word_recall(truth: list[str], found: list[str]) -> float:
    from collections import Counter

    return sum((Counter(truth) & Counter(found)).values()) / len(truth)


def cap_trade(caps: list[int]) -> list[dict[str, Any]]:
    """OCR_DET_MAX_SIDE's trade: peak RSS and word recall on a dense 300-dpi A4 scan, A4 pages
    of 6- and 4-point print at 300 dpi and a 5000 x 7000 photo of a dense page, per cap."""
    import numpy as np

    from samples import documents, scans
    from services.ocr_worker.config import WorkerConfig
    from services.ocr_worker.engine import PaddleOCREngine
    from services.ocr_worker.memory import malloc_trim

    small_lines = documents.english_lines(100, 7, 14)
    small = documents.text_image(small_lines, size=24, width=2481, margin=90, line_gap=1.4)
    tiny_lines = documents.english_lines(140, 8, 20)
    tiny = documents.text_image(tiny_lines, size=17, width=2481, margin=90, line_gap=1.4)
    pages = [("dense A4 300 dpi", np.asarray(scans.dense_scan(0))[:, :, ::-1].copy(),
              dense_words(0, 300)),
             ("6-pt print A4 300 dpi", np.asarray(small)[:, :, ::-1].copy(),
              " ".join(small_lines).split()),
             ("4-pt print A4 300 dpi", np.asarray(tiny)[:, :, ::-1].copy(),
              " ".join(tiny_lines).split()),
             ("photo 5000x7000", np.asarray(scans.photo_of_page(2))[:, :, ::-1].copy(),
              dense_words(2, 600))]
    engine = PaddleOCREngine(WorkerConfig(warmup=False))
    engine.load()
    inner = engine._pipeline.paddlex_pipeline._pipeline
    rows = []
    for cap in caps:
        inner.text_det_max_side_limit = cap
        for name, image, truth in pages:
            gc.collect()
            malloc_trim()
            base = _rss_mib()
            _reset_peak()
            output = engine.predict([image], {})[0].result_json()
            found = " ".join(output["rec_texts"]).split()
            rows.append({"cap": cap, "page": name,
                         "engine": engine.info,
                         "peak_over_idle_mib": _peak_mib() - base,
                         "word_recall": word_recall(truth, found)})
            del output
    return rows


def write_pages(pages_dir: Path) -> None:
    from samples import scans

    pages_dir.mkdir(parents=True, exist_ok=True)
    if any(pages_dir.iterdir()):
        return
    for index, (name, data) in enumerate(scans.scan_set(10, seed=0)):
        (pages_dir / f"{index:02d}-{name.replace(':', '_')}").write_bytes(data)


def _in_child(*args: str, env: dict[str, str] | None = None) -> Any:
    """This module run with these arguments in a fresh process; the JSON it prints last."""
    done = subprocess.run([sys.executable, "-m", "loadtest.memory_sources", *args], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    steps = {"--child": lambda: child(argv[1], Path(argv[2])),
             "--split": lambda: peak_split(Path(argv[1])),
             "--caps": lambda: cap_trade([int(c) for c in argv[1:]])}
    if argv and argv[0] in steps:
        print(json.dumps(steps[argv[0]]()))
        return 0
    pages_dir = report.results_dir() / "memory_pages"
    write_pages(pages_dir)
    report.begin()
    results: dict[str, Any] = {"variants": []}
    for name in argv or list(VARIANTS):
        env = {**os.environ, **VARIANTS[name].get("env", {})}
        if "LD_PRELOAD" in env and not Path(env["LD_PRELOAD"]).is_file():
            print(f"{name}: skipped ({env['LD_PRELOAD']} is not installed)", flush=True)
            continue
        started = time.monotonic()
        result = _in_child("--child", name, str(pages_dir), env=env)
        result["seconds"] = round(time.monotonic() - started, 1)
        results["variants"].append(result)
        print(f"{name}: after load {result['after_load_mib']:.0f} MiB, steady after 10 pages "
              f"{result['steady_end_mib']:.0f} (max {result['steady_max_mib']:.0f}), peak "
              f"{result['peak_max_mib']:.0f} MiB", flush=True)
    results["peak_split"] = _in_child("--split", str(pages_dir))
    print(json.dumps(results["peak_split"], indent=1))
    results["det_cap_trade"] = _in_child("--caps", "4000", "1600", "1200")
    for row in results["det_cap_trade"]:
        print(f"OCR_DET_MAX_SIDE={row['cap']}: {row['page']}: peak "
              f"+{row['peak_over_idle_mib']:.0f} MiB, word recall {row['word_recall']:.3f}",
              flush=True)
    engines = [v["engine"] for v in results["variants"]] + [results["peak_split"]["engine"]]
    path = report.write_json("memory_sources.json", {**results, **report.stamp(engines)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
