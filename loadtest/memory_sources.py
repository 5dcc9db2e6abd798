"""Where a worker's memory goes on large pages (docs/operations.md, "Memory"), each step in a
fresh process with the real engine (1 thread): per VARIANTS entry (allocators, backends) ten
large pages (BENCH_MEMORY_ROUNDS rounds, 3 by default), each one's peak and the RSS after it
(steady), and their CPU seconds; one 300-dpi
A4 page's peak split; OCR_DET_MAX_SIDE's trade (peak and word recall). Writes
memory_sources.json. Run: python -m loadtest.memory_sources [variant ...] (not in make bench)."""

import dataclasses
import functools
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any, Callable
from unittest import mock

from loadtest import procstats, report

FILE = "memory_sources.json"
PAGES = 10  # large scans (samples/scans.py scan_set)
ROUNDS = int(os.environ.get("BENCH_MEMORY_ROUNDS", "3"))  # the same pages, again and again
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
VARIANTS: dict[str, dict[str, Any]] = {
    "arena on (onnxruntime default)": {"arena": True},
    "arena on + shrinkage run option": {"arena": True, "shrink": True},
    "arena kSameAsRequested (env allocator)": {"arena": True, "same_as_requested": True},
    "arena off": {"arena": False},
    "arena off + MALLOC_ARENA_MAX=2": {"arena": False, "env": {"MALLOC_ARENA_MAX": "2"}},
    "arena on + jemalloc": {"arena": True, "env": {"LD_PRELOAD": JEMALLOC}},
    "arena off + jemalloc": {"arena": False, "env": {"LD_PRELOAD": JEMALLOC}},
    "arena off + malloc_trim": {"arena": False, "trim": True},
    "arena on, shrunk after large inputs + malloc_trim (worker default)":
        {"arena": True, "trim": True, "shrink_large": True},
    "the worker default at PaddleX's detector cap (OCR_DET_MAX_SIDE=4000)":
        {"arena": True, "trim": True, "shrink_large": True, "det_max_side": 4000},
    "OpenVINO bf16, buffers released after large inputs (OCR_BACKEND=openvino)":
        {"arena": False, "trim": True, "backend": "openvino"},
    "OpenVINO bf16, buffers never released":
        {"arena": False, "trim": True, "backend": "openvino", "keep_buffers": True},
}


def _measured(call: Callable[[], Any], trim: bool = False) -> tuple[Any, float, float, float]:
    """call()'s result and this process's RSS (MiB) before it, at its peak during it and after
    it, each of before and after read once garbage is collected (and with `trim`, the heap
    trimmed)."""
    from services.ocr_api.heap import malloc_trim

    def settle() -> float:
        gc.collect()
        if trim:
            malloc_trim()
        return procstats.rss_kib(os.getpid()) / 1024

    base = settle()
    procstats.reset_peak_rss(os.getpid())
    out = call()
    return out, base, procstats.peak_rss_kib(os.getpid()) / 1024, settle()


def _engine(**config: Any) -> tuple[Any, Any]:
    """A loaded PaddleOCREngine with these WorkerConfig settings, and its PaddleX pipeline."""
    from services.ocr_worker.config import WorkerConfig
    from services.ocr_worker.engine import PaddleOCREngine

    engine = PaddleOCREngine(WorkerConfig(warmup=False, **config))
    engine.load()
    return engine, engine._pipeline.paddlex_pipeline._pipeline


def child(name: str, pages_dir: str) -> dict[str, Any]:
    """One variant over the pages in `pages_dir`, in this (fresh) process."""
    import cv2
    import numpy as np
    import onnxruntime as ort

    variant = VARIANTS[name]
    if not variant.get("shrink_large"):  # the arena as onnxruntime keeps it
        from services.ocr_worker import engine_tuning
        engine_tuning.SHRINK_MIN_VALUES = float("inf")
    if variant.get("keep_buffers"):  # OpenVINO keeps its buffers at the largest input seen
        from services.ocr_worker import openvino_backend
        openvino_backend.RELEASE_MIN_VALUES = float("inf")
    engine, inner = _engine(ort_cpu_arena=variant["arena"],
                            backend=variant.get("backend", "onnxruntime"),
                            **{k: variant[k] for k in ("det_max_side",) if k in variant})
    if variant.get("same_as_requested"):  # sessions using an arena allocator registered here
        ort.create_and_register_allocator(ort.OrtMemoryInfo(
            "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT),
            ort.OrtArenaCfg(0, 1, -1, -1))
    run_options = ort.RunOptions()
    run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    for runner in (inner.text_det_model.runner, inner.text_rec_model.runner):
        if variant.get("same_as_requested"):
            options = runner._build_session_options()
            options.add_session_config_entry("session.use_env_allocators", "1")
            runner.session = ort.InferenceSession(str(runner._get_model_path()), options,
                                                  providers=["CPUExecutionProvider"])
        if variant.get("shrink"):  # PaddleX's runner passes no RunOptions: bind them to run()
            runner.session.run = functools.partial(runner.session.run, run_options=run_options)
    engine.predict([np.full((96, 480, 3), 255, np.uint8)], {})
    after_load, pages = procstats.rss_kib(os.getpid()) / 1024, []
    started = time.process_time()
    for turn, path in enumerate(sorted(Path(pages_dir).iterdir()) * ROUNDS):
        data = np.frombuffer(path.read_bytes(), np.uint8)
        texts, _, peak, steady = _measured(lambda: len(engine.predict([cv2.imdecode(
            data, cv2.IMREAD_COLOR)], {})[0].result_json()["rec_texts"]), variant.get("trim"))
        pages.append({"page": path.name, "round": turn // PAGES + 1, "texts": texts,
                      "peak_mib": peak, "steady_mib": steady})
    return {"variant": name, "engine": engine.info, "after_load_mib": after_load, "pages": pages,
            "cpu_s": round(time.process_time() - started, 1),
            "steady_end_mib": steady, "steady_max_mib": max(p["steady_mib"] for p in pages),
            "steady_by_round_mib": [max(p["steady_mib"] for p in pages if p["round"] == r)
                                    for r in range(1, ROUNDS + 1)],
            "peak_max_mib": max(p["peak_mib"] for p in pages)}


def peak_split(pages_dir: str) -> dict[str, Any]:
    """One 300-dpi A4 page: the detector's activations alone vs the pipeline's numpy arrays."""
    import cv2
    import numpy as np
    import onnxruntime as ort

    engine, inner = _engine(ort_cpu_arena=False, backend="onnxruntime")
    page = next(p for p in sorted(Path(pages_dir).iterdir()) if "dense" in p.name)
    image = cv2.imdecode(np.frombuffer(page.read_bytes(), np.uint8), cv2.IMREAD_COLOR)
    runner, seen = inner.text_det_model.runner, {}
    original = type(runner).__call__

    def spy(self, x=None, **kwargs):
        if self is runner:  # the detector's runner (the recognizer's shares the class)
            seen["input_shape"] = list(x[0].shape)
            seen["numpy_before_det_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        return original(self, x=x, **kwargs)

    with mock.patch.object(type(runner), "__call__", spy):
        gc.collect()
        tracemalloc.start()
        engine.predict([image], {})
        seen["numpy_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    results = {"page": page.name, "engine": engine.info,
               "decoded_page_mib": image.nbytes / 2**20, **seen}
    for key, arena in (("arena_on", True), ("arena_off", False)):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.enable_cpu_mem_arena = 1, arena
        session = ort.InferenceSession(str(runner._get_model_path()), options,
                                       providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name:
                np.random.default_rng(0).random(seen["input_shape"], dtype=np.float32)}
        _, base, peak, after = _measured(lambda: len(session.run(None, feed)))
        results[f"det_run_peak_over_input_mib_{key}"] = peak - base
        results[f"det_run_retained_mib_{key}"] = after - base
        del session, feed
    return results


def cap_trade(*caps: str) -> list[dict[str, Any]]:
    """OCR_DET_MAX_SIDE's trade: peak RSS and word recall on a dense 300-dpi A4 scan, A4 pages
    of 6- and 4-point print at 300 dpi and a 5000 x 7000 photo of a dense page, per cap."""
    import numpy as np

    from samples import documents, scans

    def dense_words(seed: int, dpi: int) -> list[str]:  # what documents.dense_page prints
        size = max(12, int(dpi * 0.15))
        count = int((int(11.69 * dpi) - 2 * size * 3) / (size * 1.5))
        return " ".join(documents.english_lines(count, seed, 9)).split()

    pages = [("dense A4 300 dpi", scans.dense_scan(0), dense_words(0, 300))]
    for points, size, count, seed, words in ((6, 24, 100, 7, 14), (4, 17, 140, 8, 20)):
        lines = documents.english_lines(count, seed, words)
        pages.append((f"{points}-pt print A4 300 dpi", documents.text_image(
            lines, size=size, width=2481, margin=90, line_gap=1.4), " ".join(lines).split()))
    pages.append(("photo 5000x7000", scans.photo_of_page(2), dense_words(2, 600)))
    pages = [(name, np.asarray(page)[:, :, ::-1].copy(), truth) for name, page, truth in pages]
    engine, _ = _engine()
    trade = []
    for cap in map(int, caps):
        engine.config = dataclasses.replace(engine.config, det_max_side=cap)
        for name, image, truth in pages:
            found, base, peak, _ = _measured(lambda: " ".join(engine.predict([image], {})[0]
                                             .result_json()["rec_texts"]).split(), True)
            trade.append({"cap": cap, "page": name, "engine": engine.info,
                          "peak_over_idle_mib": peak - base, "word_recall":
                          sum((Counter(truth) & Counter(found)).values()) / len(truth)})
    return trade


def _in_child(*args: str, env: dict[str, str] | None = None) -> Any:
    """This module run with these arguments in a fresh process; the JSON it prints last."""
    done = subprocess.run([sys.executable, "-m", "loadtest.memory_sources", *args], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure() -> dict[str, Any]:
    from samples import scans

    pages_dir = report.results_dir() / "memory_pages"
    pages_dir.mkdir(parents=True, exist_ok=True)
    if not any(pages_dir.iterdir()):
        for index, (name, data) in enumerate(scans.scan_set(PAGES, seed=0)):
            (pages_dir / f"{index:02d}-{name.replace(':', '_')}").write_bytes(data)
    variants = []
    for name in sys.argv[1:] or list(VARIANTS):
        env = {**os.environ, **VARIANTS[name].get("env", {})}
        if "LD_PRELOAD" in env and not Path(env["LD_PRELOAD"]).is_file():
            report.say(f"{name}: skipped ({env['LD_PRELOAD']} is not installed)")
            continue
        started = time.monotonic()
        variants.append(_in_child("--child", name, str(pages_dir), env=env))
        variants[-1]["seconds"] = round(time.monotonic() - started, 1)
        report.say(f"{name}: peak {variants[-1]['peak_max_mib']:,.0f} MiB")
    split = _in_child("--split", str(pages_dir))
    return {"variants": variants, "peak_split": split,
            "det_cap_trade": _in_child("--caps", "4000", "2000", "1600", "1200"),
            **report.stamp([v["engine"] for v in variants] + [split["engine"]])}


def table(result: dict[str, Any]) -> str:
    """The variants over rounds of ten large pages, one A4 page's peak split, OCR_DET_MAX_SIDE's
    trade."""
    variants = [[v["variant"], f"{v['after_load_mib']:,.0f}",
                 " / ".join(f"{mib:,.0f}" for mib in v.get("steady_by_round_mib",
                                                          [v["steady_end_mib"]])),
                 f"{v['peak_max_mib']:,.0f}", v.get("cpu_s", "")] for v in result["variants"]]
    split, trade = result["peak_split"], result["det_cap_trade"]
    parts = [["the decoded page (BGR)", split["decoded_page_mib"]],
             ["pre-processing, held during detection (numpy, tracemalloc)",
              split["numpy_before_det_mib"]],
             [f"the detector's activations, arena off (on: "
              f"{split['det_run_peak_over_input_mib_arena_on']:,.0f}, and "
              f"{split['det_run_retained_mib_arena_on']:,.0f} kept)",
              split["det_run_peak_over_input_mib_arena_off"]],
             ["the pipeline's numpy peak overall", split["numpy_peak_mib"]]]
    pages = list(dict.fromkeys(row["page"] for row in trade))
    cell = {(r["cap"], r["page"]): f"+{r['peak_over_idle_mib']:,.0f} MiB, "
            f"{r['word_recall'] * 100:.1f} %" for r in trade}
    engines = report.engine_label([v["engine"] for v in result["variants"]]
                                  + [r["engine"] for r in trade])
    return "\n".join([
        report.markdown(["setting", "after load", "steady, most in each round of 10 pages",
                         "peak", "CPU s (all rounds)"], variants),
        f"\nOne page's peak ({split['page']}; the detector sees it at "
        f"{' x '.join(str(n) for n in split['input_shape'][2:][::-1])}), MiB:\n",
        report.markdown(["part", "MiB"], [[part, round(mib)] for part, mib in parts]),
        "\n`OCR_DET_MAX_SIDE`: the peak over idle and the share of the words found:\n",
        report.markdown(["`OCR_DET_MAX_SIDE`", *pages], [[cap, *(cell[(cap, page)] for page in
                        pages)] for cap in dict.fromkeys(row["cap"] for row in trade)]),
        f"\nEngine: {engines}. {report.measured(result)}."])


if __name__ == "__main__":
    CHILD_STEPS = {"--child": child, "--split": peak_split, "--caps": cap_trade}
    if len(sys.argv) > 1 and sys.argv[1] in CHILD_STEPS:
        print(json.dumps(CHILD_STEPS[sys.argv[1]](*sys.argv[2:])))
    else:
        sys.exit(report.main(sys.modules[__name__]))
