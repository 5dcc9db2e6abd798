"""The worker's memory pieces without a server: the memory budget, the keeper that trims and
watches the ceiling, the recycle protocol's master-side bookkeeping, and onnxruntime's CPU
arena: on, and shrunk after large inputs."""

from __future__ import annotations

import logging
import os
import signal
import types

import numpy as np
import pytest

from services.ocr_api.errors import ApiError
from services.ocr_api import heap
from services.ocr_worker import memory, recycle
from services.ocr_worker.admission import MemoryBudget
from services.ocr_worker.config import WorkerConfig
from services.ocr_worker.engine import (detector_side_limit, onnxruntime_engine_config,
                                         tune_pipeline_memory)

MIB = 1024 * 1024


# ---- MemoryBudget ----------------------------------------------------------------------------
def test_budget_refuses_what_does_not_fit_and_frees_on_exit():
    budget = MemoryBudget(10 * MIB, retry_after_s=2)
    with budget.reserve(6 * MIB) as first:
        assert budget.reserved == 6 * MIB
        with pytest.raises(ApiError) as caught:
            with budget.reserve(5 * MIB):
                pass
        assert caught.value.status == 503 and caught.value.headers["Retry-After"] == "2"
        assert budget.reserved == 6 * MIB
        with budget.reserve(1 * MIB) as second:
            with pytest.raises(ApiError):
                second.grow_to(5 * MIB)  # growing past the budget is refused too
            assert second.nbytes == 1 * MIB
        first.grow_to(9 * MIB)
        assert budget.reserved == 9 * MIB
    assert budget.reserved == 0


def test_budget_lets_a_request_bigger_than_everything_run_alone():
    budget = MemoryBudget(1 * MIB, retry_after_s=1)
    with budget.reserve(0) as alone:
        alone.grow_to(50 * MIB)
        assert budget.reserved == 50 * MIB
    assert budget.reserved == 0


def test_a_zero_budget_is_no_limit():
    budget = MemoryBudget(0, retry_after_s=1)
    with budget.reserve(10**12), budget.reserve(10**12):
        assert budget.reserved == 2 * 10**12


# ---- MemoryKeeper ----------------------------------------------------------------------------
def keeper(rss_values, ceiling_mb=100, trim_min_pixels=1000, retry_s=300.0):
    calls = {"trim": 0, "over": [], "observed": []}
    values = iter(rss_values)

    def trim():
        calls["trim"] += 1
        return True

    k = memory.MemoryKeeper(trim_min_pixels=trim_min_pixels, ceiling_bytes=ceiling_mb * MIB,
                            over_ceiling=calls["over"].append,
                            observe=calls["observed"].append, rss=lambda: next(values),
                            trim=trim, retry_s=retry_s)
    return k, calls


def test_keeper_trims_only_after_large_batches():
    k, calls = keeper([10 * MIB] * 3)
    k.after_batch(999)
    assert calls["trim"] == 0
    k.after_batch(1000)
    k.after_batch(10**7)
    assert calls["trim"] == 2 and k.trims == 2
    assert calls["observed"] == [10 * MIB] * 3


def test_keeper_asks_for_a_replacement_once_when_over_the_ceiling():
    k, calls = keeper([90 * MIB, 120 * MIB, 130 * MIB, 140 * MIB])
    for _ in range(4):
        k.after_batch(10)
    assert calls["over"] == [120 * MIB]


def test_keeper_asks_again_after_the_retry_interval():
    k, calls = keeper([120 * MIB, 120 * MIB], retry_s=0.0)
    k.after_batch(10)
    k.after_batch(10)
    assert len(calls["over"]) == 2


def test_no_ceiling_means_never_asking():
    k, calls = keeper([10**12], ceiling_mb=0)
    k.after_batch(10)
    assert calls["over"] == []


def test_rss_and_trim_work_here():
    assert heap.rss_bytes() > 10 * MIB
    assert heap.rss_bytes(os.getpid()) > 10 * MIB
    assert heap.rss_bytes(2**31 - 1) == 0  # no such process
    assert heap.malloc_trim() in (True, False)


# ---- recycle bookkeeping (master side) ---------------------------------------------------------
def fake_server(pids_and_ages, configured=1):
    workers = {pid: types.SimpleNamespace(age=age) for pid, age in pids_and_ages}
    return types.SimpleNamespace(WORKERS=workers, num_workers=len(workers),
                                 cfg=types.SimpleNamespace(workers=configured))


def test_a_process_that_asked_becomes_the_oldest_and_gets_its_age_back(tmp_path, monkeypatch):
    monkeypatch.setenv(recycle.DIR_VARIABLE, str(tmp_path))
    server = fake_server([(101, 1), (102, 2)])
    (tmp_path / "recycle-102").touch()
    recycle.mark_oldest(server)
    assert server.WORKERS[102].age == -1 and server.WORKERS[101].age == 1
    oldest = sorted(server.WORKERS.items(), key=lambda w: w[1].age)[0][0]
    assert oldest == 102
    recycle.forget(102)
    recycle.mark_oldest(server)
    assert server.WORKERS[102].age == 2
    assert recycle.requested_pids() == set()


def test_request_replacement_writes_the_marker_and_signals_the_master(tmp_path, monkeypatch):
    monkeypatch.setenv(recycle.DIR_VARIABLE, str(tmp_path))
    sent = []
    monkeypatch.setattr(recycle.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    assert recycle.request_replacement(123)
    assert recycle.requested_pids() == {os.getpid()}
    assert sent == [(os.getppid(), signal.SIGTTIN)]


def test_without_a_master_nothing_is_requested(monkeypatch):
    monkeypatch.delenv(recycle.DIR_VARIABLE, raising=False)
    assert recycle.request_replacement(123) is False


def test_a_replacement_is_a_process_started_beyond_the_configured_count():
    assert recycle.is_replacement(fake_server([(1, 1), (2, 2)], configured=1))
    assert not recycle.is_replacement(fake_server([(1, 1), (2, 2)], configured=2))


def test_a_ready_replacement_has_the_old_process_stopped(monkeypatch, tmp_path):
    monkeypatch.setenv(recycle.DIR_VARIABLE, str(tmp_path))
    sent = []
    monkeypatch.setattr(recycle.os, "kill", lambda pid, sig: sent.append(sig))
    (tmp_path / "recycle-4242").touch()
    assert recycle.become_ready_then_take_over(ready=lambda t: True, failed=lambda: False,
                                               heartbeat=lambda: None, alive=lambda: True)
    assert sent == [signal.SIGTTOU]
    assert recycle.requested_pids() == {4242}  # the old process is the one stopped


def test_a_replacement_that_cannot_load_offers_itself_instead(monkeypatch, tmp_path):
    monkeypatch.setenv(recycle.DIR_VARIABLE, str(tmp_path))
    sent = []
    monkeypatch.setattr(recycle.os, "kill", lambda pid, sig: sent.append(sig))
    (tmp_path / "recycle-4242").touch()
    beats = []
    assert not recycle.become_ready_then_take_over(
        ready=lambda t: False, failed=lambda: len(beats) >= 3,
        heartbeat=lambda: beats.append(1), alive=lambda: True)
    assert sent == [signal.SIGTTOU]
    assert recycle.requested_pids() == {os.getpid()}


# ---- engine options --------------------------------------------------------------------------
def test_the_cpu_arena_is_on_unless_switched_off():
    on = onnxruntime_engine_config(WorkerConfig(threads=3))
    assert on["enable_cpu_mem_arena"] is True and on["intra_op_num_threads"] == 3
    assert onnxruntime_engine_config(WorkerConfig(ort_cpu_arena=False))[
        "enable_cpu_mem_arena"] is False


class RecordingSession:
    def __init__(self):
        self.options = []

    def run(self, output_names, feeds, run_options=None):
        self.options.append(run_options)
        return ["out"]

    def get_inputs(self):
        return ["x"]


def test_the_arena_is_shrunk_after_a_large_input_only():
    ort = pytest.importorskip("onnxruntime")
    from services.ocr_worker.engine_tuning import ArenaShrink

    inner = RecordingSession()
    session = ArenaShrink(inner, min_values=1000)
    assert session.run(None, {"x": np.zeros((1, 3, 10, 10))}) == ["out"]  # 300 values
    session.run(None, {"x": np.zeros((1, 3, 20, 20))})  # 1,200
    small, large = inner.options
    assert small is None
    assert isinstance(large, ort.RunOptions)
    assert large.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    assert session.get_inputs() == ["x"]  # the rest is the session's own


def test_the_paddlex_runner_accepts_our_engine_config():
    pytest.importorskip("paddlex")
    from paddlex.inference.models.runners.onnxruntime_runner import ONNXRuntimeRunnerConfig

    config = ONNXRuntimeRunnerConfig.model_validate(onnxruntime_engine_config(WorkerConfig()))
    assert config.enable_cpu_mem_arena is True


def test_the_detector_cap_reaches_the_pipeline():
    inner = types.SimpleNamespace(text_det_max_side_limit=4000)
    pipeline = types.SimpleNamespace(paddlex_pipeline=types.SimpleNamespace(_pipeline=inner))
    tune_pipeline_memory(pipeline, WorkerConfig(det_max_side=2048))
    assert inner.text_det_max_side_limit == 2048


def test_a_long_narrow_page_gets_a_longer_side_and_the_area_of_a_page_at_the_cap():
    cap = 2000
    area = cap * cap / 1.5  # a page 1.5 times as long as it is wide, at the cap
    for height, width in ((3508, 2481), (2481, 3508), (2481, 1749), (6000, 6000), (3300, 2550),
                          (1754, 1240), (400, 300)):
        assert detector_side_limit(height, width, cap) == cap  # A4, Letter, square: the cap
    for height, width in ((8380, 1080), (1080, 8380), (4200, 1200), (30000, 100), (2106, 1260)):
        side = detector_side_limit(height, width, cap)
        scale = side / max(height, width)
        assert side > cap
        assert scale >= 1 or abs(height * width * scale ** 2 / area - 1) < 0.01


def test_paddlex_notice_of_each_capped_page_is_dropped_and_its_other_warnings_kept():
    """At the default cap every scan is resized before detection; PaddleX warns each time."""
    pipeline = types.SimpleNamespace(paddlex_pipeline=types.SimpleNamespace(
        _pipeline=types.SimpleNamespace(text_det_max_side_limit=4000)))
    tune_pipeline_memory(pipeline, WorkerConfig())
    tune_pipeline_memory(pipeline, WorkerConfig())  # a second engine adds no second filter
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    paddlex_log = logging.getLogger("paddlex")
    paddlex_log.addHandler(handler)
    try:
        paddlex_log.warning("Resized image size (1600x2262) exceeds max_side_limit of 2000. "
                            "Resizing to fit within limit.")
        paddlex_log.warning("something else")
    finally:
        paddlex_log.removeHandler(handler)
    assert seen == ["something else"]
    assert pipeline.paddlex_pipeline._pipeline.text_det_max_side_limit == 2000


def test_on_a_gpu_the_cuda_arena_grows_by_what_is_asked_and_keeps_its_device():
    pytest.importorskip("paddlex")
    from paddlex.inference.models.runners.onnxruntime_runner import (ONNXRuntimeRunner,
                                                                      ONNXRuntimeRunnerConfig)

    engine_config = onnxruntime_engine_config(WorkerConfig(device="gpu:0"))
    validated = ONNXRuntimeRunnerConfig.model_validate(
        {**engine_config, "device_type": "gpu", "device_id": 0}).model_dump(exclude_none=True)
    runner = ONNXRuntimeRunner.__new__(ONNXRuntimeRunner)  # no session: no CUDA needed
    runner._config = validated
    runner._ort = types.SimpleNamespace(
        get_available_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    providers, options = runner._resolve_providers()
    assert providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert options[0] == {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"}
    assert "provider_options" not in onnxruntime_engine_config(WorkerConfig())


def test_a_tiffs_reservation_covers_its_largest_selected_frame_not_its_first():
    import io

    from PIL import Image

    from services.ocr_api.request import parse_ocr_request
    from services.ocr_worker.decode import DecodeLimits, open_document

    frames = [Image.new("L", (10, 10), 255), Image.new("L", (400, 300), 255),
              Image.new("L", (20, 20), 255)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="TIFF", save_all=True, append_images=frames[1:])
    limits = DecodeLimits(max_pages=10, max_pixels=10 ** 8, pdf_dpi=144)
    import base64

    def reservation(page_range):
        fields = {"file": base64.b64encode(buffer.getvalue()).decode(), "fileType": 1,
                  **({"pageRange": page_range} if page_range else {})}
        document = open_document(parse_ocr_request(fields, max_bytes=10 ** 7), limits)
        document.close()
        return document.page_bytes

    assert reservation(None) == 400 * 300 * 3  # the second frame, not the 10 x 10 first
    assert reservation("1,3") == 20 * 20 * 3  # of the frames selected
