"""The accuracy corpus and its scoring (loadtest/accuracy_metrics.py, accuracy_corpus.py), the
default-setting rule of bench_accuracy, and the PaddleX serving config bench_paddlex writes.
No engine, no network: born-digital pages only."""

from __future__ import annotations

import yaml

from loadtest import bench_accuracy, bench_paddlex
from samples import accuracy_corpus
from loadtest.accuracy_metrics import (Score, changed_lines, normalize_lines, score_page,
                                       words)


def test_normalisation_keeps_what_a_reader_sees():
    assert normalize_lines(["clothes ; but", "it was \u201cspiritual gifts.\u201d"]) == \
        'clothes; but it was "spiritual gifts."'
    assert normalize_lines(["发票 号码 12345", "客户"]) == "发票号码12345客户"
    # a full-width colon in English text stays an error (NFC, not NFKC)
    assert normalize_lines(["Total due\uff1a EUR"]) != normalize_lines(["Total due: EUR"])


def test_cer_and_word_f1():
    perfect = score_page(["Total due: EUR 12.50"], ["Total due:", "EUR 12.50"])
    assert perfect.cer == 0.0 and perfect.word_f1 == 1.0
    one_edit = score_page(["Tota due"], ["Total due"])
    assert one_edit.edits == 1 and one_edit.chars == 9
    assert abs(one_edit.word_f1 - 0.5) < 1e-9
    assert words("发票 total 12,345.60") == ["发", "票", "total", "12,345.60"]
    total = Score() + perfect + one_edit
    assert total.chars == perfect.chars + 9 and total.edits == 1


def test_changed_lines_counts_lines_not_positions():
    assert changed_lines(["a", "b"], ["b", "a"]) == 0
    assert changed_lines(["a", "x"], ["a", "b"]) == 1
    assert changed_lines(["a"], ["a", "b"]) == 1


def test_born_digital_pages_carry_their_text_layer_as_truth():
    pdfs = accuracy_corpus.born_digital_pdfs()
    assert {"en-invoice-table", "en-prose-courier-9pt"} <= set(pdfs)
    assert pdfs == accuracy_corpus.born_digital_pdfs()  # deterministic bytes
    [truth] = accuracy_corpus.text_layer(pdfs["en-invoice-table"])
    assert truth[0] == "Invoice 2024-0117" and len(truth) > 20
    [image] = accuracy_corpus.render(pdfs["en-invoice-table"])
    assert image.shape == (1684, 1191, 3)  # A4 at 144 DPI, as the worker renders it
    if "zh-prose" in pdfs:
        [zh] = accuracy_corpus.text_layer(pdfs["zh-prose"])
        assert zh[0] == "年度工作报告" and any("元" in line for line in zh)


def test_transcriptions_exist_for_every_scan():
    for transcription in accuracy_corpus.SCANS.values():
        lines = accuracy_corpus.transcription(transcription)
        assert len(lines) > 10


def test_default_is_the_fastest_setting_within_the_cer_tolerance():
    def setting(label, cer_edits, cpu):
        made = bench_accuracy.Setting(label, {})
        made.score, made.cpu_s = Score(chars=10000, edits=cer_edits), cpu
        return made

    reference = setting("reference", 100, 10.0)
    close_fast = setting("close", 103, 7.0)  # CER 3 % over the reference's
    faster_worse = setting("worse", 104, 5.0)  # 4 % over
    assert bench_accuracy.chosen([reference, close_fast, faster_worse]) is close_fast
    assert bench_accuracy.chosen([reference, faster_worse]) is reference


def test_paddlex_serving_config_uses_our_models_on_onnxruntime(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_paddlex, "SERVING_DIR", tmp_path)
    config = yaml.safe_load(bench_paddlex.pipeline_config(2).read_text())
    assert config["engine"] == "onnxruntime"
    assert config["engine_config"]["intra_op_num_threads"] == 2
    assert not config["use_doc_preprocessor"] and not config["use_textline_orientation"]
    det, rec = config["SubModules"]["TextDetection"], config["SubModules"]["TextRecognition"]
    assert det["model_dir"].endswith("models/PP-OCRv6_tiny_det")
    assert rec["model_name"] == "PP-OCRv6_tiny_rec" and rec["batch_size"] == 6
    assert config["Serving"]["extra"]["max_num_input_imgs"] is None
    assert [r.split("==")[0] for r in bench_paddlex.requirements()] == \
        ["paddlex[ocr-core,serving]", "onnxruntime"]


def test_paddlex_part_is_skipped_with_its_reason(monkeypatch):
    def cannot_build():
        raise OSError("no network")

    monkeypatch.setattr(bench_paddlex, "ensure_venv", cannot_build)
    result = bench_paddlex.measure()
    assert result["skipped"] == "could not build bench/paddlex-venv (OSError: no network)"
    [[name, measured, _goal, verdict]] = bench_paddlex.rows(result)
    assert verdict == "SKIP" and "no network" in measured


def test_synthetic_scans_are_the_same_page_at_every_resolution():
    """The scan corpus draws each page in points: the same text (the truth) at 150 and 400 dpi,
    8/3 times the pixels a side; small print included."""
    low = accuracy_corpus.synthetic_scan("table-small-print", 150)
    high = accuracy_corpus.synthetic_scan("table-small-print", 400)
    assert low.truth == high.truth and len(low.truth) == 20
    assert low.truth[2].startswith("Date Ref Description Qty Unit Amount")
    assert abs(high.image.width / low.image.width - 400 / 150) < 0.01
    assert low.image.mode == "L"
    assert accuracy_corpus.synthetic_scan("footnotes-6.5pt", 200).truth[-1][0].isdigit()
    assert set(accuracy_corpus.QUICK_SYNTHETIC) <= set(accuracy_corpus.SYNTHETIC)


def test_a_setting_too_far_on_one_kind_is_not_chosen():
    """Averaged together the kinds hide opposite moves: a faster setting that is better on
    scans and worse on born-digital pages is within the tolerance overall, not on each kind."""
    def page(name, kind):
        return accuracy_corpus.CorpusPage(name, None, ["abcdefghij" * 100], kind)

    digital, scan = page("d", "born-digital"), page("s", "scan")
    kinds = {"born-digital": [digital], "scan": [scan]}

    def setting(label, digital_text, scan_text, cpu):
        made = bench_accuracy.Setting(label, {}, cpu_s=cpu)
        made.texts = {"d": [digital_text], "s": [scan_text]}
        made.score = score_page([digital_text], digital.truth) + score_page([scan_text],
                                                                            scan.truth)
        return made

    truth = "abcdefghij" * 100
    reference = setting("reference", truth, "x" * 10 + truth[10:], 10.0)
    opposite = setting("opposite", "x" * 6 + truth[6:], truth, 5.0)  # -10 on scans, +6 digital
    assert opposite.score.cer < reference.score.cer
    assert bench_accuracy.chosen([reference, opposite]) is opposite
    assert bench_accuracy.too_far(opposite, reference, kinds) == ["born-digital"]
    assert bench_accuracy.chosen([reference, opposite], kinds) is reference


def test_the_scan_pdf_goal():
    def case(page, dpi, image_edits, pdf_edits):
        return {"page": page, "pdf_dpi": dpi, "image": {"edits": image_edits, "chars": 1000},
                "pdf": {"edits": pdf_edits, "chars": 1000},
                "much_worse": bench_accuracy.much_worse(pdf_edits / 1000, image_edits / 1000)}

    same = [case(f"p{i}", dpi, 30, 30) for i in range(2) for dpi in (150, 200, 300, 400)]
    assert bench_accuracy.summarise_scans(same, [])["goal"]["met"]
    assert not bench_accuracy.much_worse(0.035, 0.030)  # +0.005: noise, not much worse
    assert bench_accuracy.much_worse(0.166, 0.043)  # issue 26's table at 144 DPI
    one_bad = same[:-1] + [case("p1", 400, 30, 60)]
    goal = bench_accuracy.summarise_scans(one_bad, [])["goal"]
    assert not goal["met"] and goal["much_worse_pages"] == ["p1@400dpi"]
    assert not goal["within_ratio"]  # 400 dpi: 90 edits against 60
