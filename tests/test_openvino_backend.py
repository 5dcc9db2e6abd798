"""OCR_BACKEND=openvino and the pipeline tuning (services/ocr_worker/openvino_backend.py,
engine_tuning.py): precision and backend resolution, the faster CTC decoding against PaddleX's
own on the same logits, and OpenVINO's sessions against onnxruntime's on the same tensors
(detection map and recognition logits within a tolerance at fp32, the same text end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from samples import documents
from services.ocr_api.settings import ConfigError
from services.ocr_worker import engine_tuning
from services.ocr_worker.config import WorkerConfig
from services.ocr_worker.openvino_backend import resolve_precision


def test_precision_resolution():
    assert resolve_precision("auto", ["FP32", "BF16", "INT8"]) == "bf16"
    assert resolve_precision("auto", ["FP32", "FP16", "INT8"]) == "fp32"
    assert resolve_precision("fp32", ["FP32", "BF16"]) == "fp32"
    assert resolve_precision("bf16", ["BF16"]) == "bf16"
    with pytest.raises(ValueError, match="no bf16"):
        resolve_precision("bf16", ["FP32"])
    with pytest.raises(ValueError):
        resolve_precision("int8", ["FP32"])


def test_config_validates_backend_settings():
    config = WorkerConfig.from_env({"OCR_BACKEND": "openvino", "OCR_OV_PRECISION": "bf16",
                                    "OCR_REC_BATCH_SIZE": "2"})
    assert (config.backend, config.ov_precision, config.rec_batch_size) == ("openvino", "bf16", 2)
    with pytest.raises(ConfigError, match="OCR_OV_PRECISION"):
        WorkerConfig.from_env({"OCR_OV_PRECISION": "fp16"})
    with pytest.raises(ConfigError, match="CPU only"):
        WorkerConfig.from_env({"OCR_BACKEND": "openvino", "OCR_DEVICE": "gpu:0"})


def test_auto_backend_is_onnxruntime_everywhere_and_explicit_choices_stay(monkeypatch):
    """One default engine on every machine (issue 26), bf16 CPU or not."""
    from services.ocr_worker import openvino_backend

    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ["FP32", "BF16"])
    for device in ("cpu", "gpu:0"):
        assert engine_tuning.resolve_backend(WorkerConfig(backend="auto", device=device)) \
            == "onnxruntime"
    for backend in ("onnxruntime", "openvino", "paddle"):
        assert engine_tuning.resolve_backend(WorkerConfig(backend=backend)) == backend
    assert engine_tuning.paddle_engine_name("openvino") == "onnxruntime"


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (exp / exp.sum(axis=-1, keepdims=True)).astype(np.float32)


def test_fast_ctc_decoding_equals_paddlex():
    from paddlex.inference.models.text_recognition.processors import CTCLabelDecode

    rng = np.random.default_rng(0)
    characters = list("abcdefghij0123456789")
    logits = rng.normal(size=(5, 40, len(characters) + 2)) * 4
    logits[:, ::3, 0] += 6  # blanks, so that repeats are collapsed as in real output
    probs = _softmax(logits)
    paddlex = CTCLabelDecode(characters)
    ours = CTCLabelDecode(characters)
    assert engine_tuning.install_fast_ctc(type("Rec", (), {"post_op": ours})())
    assert type(ours).__name__ == "FastCTCLabelDecode"
    expected_texts, expected_scores = paddlex([probs])
    texts, scores = ours([probs])
    assert texts == expected_texts and any(texts)
    assert scores == expected_scores
    # word boxes still go through PaddleX's own path
    kwargs = dict(return_word_box=True, wh_ratio_list=[4.0] * 5, max_wh_ratio=4.0)
    assert ours([probs], **kwargs) == paddlex([probs], **kwargs)


def test_fast_ctc_leaves_other_post_processors_alone():
    class OtherDecode:
        pass

    post_op = OtherDecode()
    assert not engine_tuning.install_fast_ctc(type("Rec", (), {"post_op": post_op})())
    assert type(post_op) is OtherDecode


# ---- against onnxruntime on the real models ---------------------------------------------------
def _engine(**overrides):
    from services.ocr_worker.engine import PaddleOCREngine

    engine = PaddleOCREngine(WorkerConfig(threads=1, **overrides))
    engine.load()
    return engine


def _runners(engine):
    inner = engine._pipeline.paddlex_pipeline._pipeline
    return inner.text_det_model.runner, inner.text_rec_model.runner


def _page() -> np.ndarray:
    lines = documents.english_lines(6, seed=3, words_per_line=7) + \
        ["Total due: EUR 1,234.56, filed by J. Smith."]
    return np.ascontiguousarray(np.asarray(documents.text_image(lines, size=30))[:, :, ::-1])


@pytest.fixture(scope="module")
def onnxruntime_run():
    """The onnxruntime engine's texts on one page and the exact tensors its sessions saw."""
    engine = _engine(backend="onnxruntime")
    captured = {"det": [], "rec": []}
    for key, runner in zip(("det", "rec"), _runners(engine)):
        run = runner.session.run

        def recording(names, feeds, run=run, key=key):
            outputs = run(names, feeds)
            captured[key].append(({k: v.copy() for k, v in feeds.items()}, outputs[0]))
            return outputs

        runner.session.run = recording
    texts = engine.predict([_page()], {})[0].result_json()["rec_texts"]
    return texts, captured


def _openvino_sessions(precision: str):
    from services.ocr_worker.openvino_backend import OpenVINOSession

    _, det_dir, _, rec_dir = WorkerConfig().model_paths()
    return [OpenVINOSession(f"{model_dir}/inference.onnx", precision, 1)
            for model_dir in (det_dir, rec_dir)]


@pytest.mark.engine
def test_openvino_fp32_sessions_match_onnxruntime_on_the_same_tensors(onnxruntime_run):
    _, captured = onnxruntime_run
    det, rec = _openvino_sessions("fp32")
    assert captured["det"] and captured["rec"]
    for feeds, expected in captured["det"]:
        [got] = det.run(None, feeds)
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() < 1e-3  # probability map in [0, 1]
    for feeds, expected in captured["rec"]:
        [got] = rec.run(None, feeds)
        assert got.shape == expected.shape  # batch x time x 6906 classes
        assert np.abs(got - expected).max() < 1e-3
        assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.999


@pytest.mark.engine
def test_openvino_bf16_sessions_stay_close_to_onnxruntime(onnxruntime_run):
    from services.ocr_worker.openvino_backend import cpu_capabilities

    if "BF16" not in cpu_capabilities():
        pytest.skip("this CPU has no bf16")
    _, captured = onnxruntime_run
    det, rec = _openvino_sessions("bf16")
    for feeds, expected in captured["det"]:
        [got] = det.run(None, feeds)
        # the text/no-text decision (threshold 0.3) agrees almost everywhere
        assert ((got > 0.3) == (expected > 0.3)).mean() > 0.99
    for feeds, expected in captured["rec"]:
        [got] = rec.run(None, feeds)
        assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.98


@pytest.mark.engine
def test_openvino_pipeline_reads_the_same_text(onnxruntime_run):
    texts, _ = onnxruntime_run
    engine = _engine(backend="openvino", ov_precision="fp32", rec_batch_size=1)
    assert engine.info["backend"] == "openvino" and engine.info["precision"] == "fp32"
    assert engine.predict([_page()], {})[0].result_json()["rec_texts"] == texts
    assert any("1,234.56" in line for line in texts), texts


@pytest.mark.engine
def test_openvino_releases_its_buffers_after_a_large_input_and_still_reads_the_same():
    """A large input's intermediate buffers are handed back (issue 26: ~2 GB held otherwise);
    the next inference allocates them again and gives the same output."""
    from services.ocr_worker.openvino_backend import RELEASE_MIN_VALUES

    det, _ = _openvino_sessions("fp32")
    released = []
    compiled = det._compiled

    class Recording:
        def release_memory(self):
            released.append(True)
            compiled.release_memory()

    det._compiled = Recording()
    name = compiled.inputs[0].any_name
    small = {name: np.random.default_rng(0).random((1, 3, 320, 320), np.float32)}
    large = {name: np.random.default_rng(1).random((1, 3, 1024, 1024), np.float32)}
    assert large[name].size >= RELEASE_MIN_VALUES > small[name].size
    [first] = det.run(None, small)
    assert not released
    [big] = det.run(None, large)
    assert released and big.shape[-2:] == (1024, 1024)
    [again] = det.run(None, small)
    assert np.array_equal(first, again)
