"""`make bench-accuracy`, two parts (BENCH_ACCURACY_PARTS). settings (issue 13): CER, word F1,
lines changed against the reference (PaddleOCR as shipped) and CPU seconds per page of each
engine setting on the accuracy corpus, in this process, interleaved page by page; the default is
the fastest setting whose CER is within CER_RELATIVE of the reference's on all pages and on each
kind of page.
scan-pdf (issue 26): scans through a fleet as images and as image-only PDFs of the same pixels.
Method, goals and knobs: docs/benchmarks.md and loadtest/README.md. Writes accuracy.json."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from loadtest import local_fleet, report
from loadtest.accuracy_metrics import Score, changed_lines, score_page
from loadtest.payloads import JSON_HEADERS, make_payload
from samples import accuracy_corpus as corpus, documents

CER_RELATIVE = 0.03  # a setting's CER at most 3 % over the reference's, on each kind (issue 47)
FILE = "accuracy.json"
PDF_CER_RATIO_GOAL = 1.10  # PDFs' CER at most 10 % above the images'
PDF_CER_SLACK = 0.001  # ...or at most this much above (absolute): a near-zero CER's ratio is noise
MUCH_WORSE = (0.01, 0.20)  # a page is read much worse as a PDF: CER up by > 0.01 and > 20 %
PARTS = ("settings", "scan-pdf")
DET_SIDES = (2000, 1600)  # the detector's input caps compared (OCR_DET_MAX_SIDE)...
PADDLEX_DET_SIDE = 4000  # ...with PaddleX's own, which every other setting runs


@dataclass
class Setting:
    label: str
    overrides: dict[str, Any]
    fast_ctc: bool = True
    engine: Any = None
    texts: dict[str, list[str]] = field(default_factory=dict)  # page name -> lines read
    seconds: dict[str, float] = field(default_factory=dict)  # page name -> CPU seconds
    cpu_s: float = 0.0
    model_s: dict[str, float] = field(default_factory=dict)  # "det"/"rec" -> CPU s in the model
    score: Score = field(default_factory=Score)


def settings() -> list[Setting]:
    """The reference first; BENCH_ACCURACY_SETTINGS keeps those whose label holds a word."""
    try:
        from services.ocr_worker import openvino_backend

        bf16 = "BF16" in openvino_backend.cpu_capabilities()
    except ImportError:
        bf16 = False
    paddlex = PADDLEX_DET_SIDE
    combos = [("onnxruntime", "fp32", b, paddlex) for b in (6, 6, 1, 2)] + [
        ("onnxruntime", "fp32", 2, side) for side in DET_SIDES] + [
        ("openvino", "fp32", 6, paddlex)] + [
        ("openvino", "bf16", b, paddlex) for b in (6, 2) if bf16]
    made = [Setting(f"{backend} {precision}, rec batch {b}" + (
        f", det side {side}" if side != paddlex else ""), {"backend": backend, **(
            {"ov_precision": precision} if backend == "openvino" else {}), "rec_batch_size": b,
            "det_max_side": side})
        for backend, precision, b, side in combos]
    made[0].label, made[0].fast_ctc = made[0].label + ", PaddleX CTC (reference)", False
    wanted = report.names("BENCH_ACCURACY_SETTINGS")
    return [s for s in made if not wanted or any(w in s.label for w in wanted)] or made[:1]


def page_score(setting: Setting, pages: list | None) -> Score:
    """Its score on these pages (None: on all of them)."""
    if pages is None:
        return setting.score
    return sum((score_page(setting.texts[p.name], p.truth) for p in pages), Score())


def too_far(setting: Setting, reference: Setting, kinds: dict[str, list] | None = None
            ) -> list[str]:
    """Where the setting's CER is over the reference's by more than CER_RELATIVE of it: "all"
    and/or the kinds of page (`kinds`: kind -> its pages)."""
    return [kind for kind, pages in {"all": None, **(kinds or {})}.items()
            if page_score(setting, pages).cer >
            page_score(reference, pages).cer * (1 + CER_RELATIVE)]


def chosen(runs: list[Setting], kinds: dict[str, list] | None = None) -> Setting:
    """The fastest setting not too_far from the reference (runs[0])."""
    return min((s for s in runs if not too_far(s, runs[0], kinds)), key=lambda s: s.cpu_s)


def run(pages: list[corpus.CorpusPage], runs: list[Setting]) -> dict[str, Any]:
    from services.ocr_worker.config import WorkerConfig
    from services.ocr_worker.engine import PaddleOCREngine

    report.say(f"{len(pages)} pages x {len(runs)} settings")
    for setting in runs:
        setting.engine = PaddleOCREngine(WorkerConfig(threads=1, **setting.overrides))
        setting.engine.load()
        if not setting.fast_ctc:  # back to PaddleX's own CTCLabelDecode
            post_op = setting.engine._pipeline.paddlex_pipeline._pipeline.text_rec_model.post_op
            post_op.__class__ = post_op.__class__.__mro__[1]
        clock_models(setting)
        setting.engine.predict([pages[0].image], {})[0].result_json()  # warm-up, untimed
        setting.model_s.clear()
    for page in pages:
        for setting in runs:
            started = time.process_time()
            texts = setting.engine.predict([page.image], {})[0].result_json()["rec_texts"]
            setting.seconds[page.name] = seconds = time.process_time() - started
            setting.texts[page.name], setting.cpu_s = texts, setting.cpu_s + seconds
            setting.score += score_page(texts, page.truth)
    reference = runs[0]
    kinds = {kind: [p for p in pages if p.kind == kind] for kind in sorted({p.kind for p in pages})}

    def figures(s: Setting, members: list) -> dict[str, Any]:
        score = page_score(s, members)
        changed = sum(changed_lines(s.texts[p.name], reference.texts[p.name]) for p in members)
        return {"cer": score.cer, "word_f1": score.word_f1, "lines_changed": changed,
                "cpu_s_per_page": sum(s.seconds[p.name] for p in members) / len(members)}

    def split(s: Setting) -> dict[str, float]:  # CPU s per page in each model
        return {f"{model}_s_per_page": seconds / len(pages) for model, seconds in s.model_s.items()}

    return {"pages": [p.name for p in pages], "page_kinds": {p.name: p.kind for p in pages},
            "reference_lines": sum(len(lines) for lines in reference.texts.values()),
            "settings": [{"label": s.label, "overrides": s.overrides, "fast_ctc": s.fast_ctc,
                          **figures(s, pages), **split(s), "speedup": reference.cpu_s / s.cpu_s,
                          "too_far": too_far(s, reference, kinds), "engine": s.engine.info}
                         for s in runs],
            "by_kind": {kind: {s.label: {**figures(s, members), "reference_lines": sum(
                len(reference.texts[p.name]) for p in members), "pages": len(members)}
                for s in runs} for kind, members in kinds.items()},
            "cer_tolerance": {"relative": CER_RELATIVE},
            "chosen": chosen(runs, kinds).label,
            "texts": {s.label: s.texts for s in runs}}


class ModelClock:
    """A model session's stand-in that adds the CPU seconds of each run() to a setting's
    model_s: where a page's time goes, the detector, the recogniser or the pipeline around
    them."""

    def __init__(self, session: Any, setting: Setting, model: str):
        self.session, self.setting, self.model = session, setting, model

    def run(self, *args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return self.session.run(*args, **kwargs)
        finally:
            self.setting.model_s[self.model] = self.setting.model_s.get(self.model, 0.0) + (
                time.process_time() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def clock_models(setting: Setting) -> None:
    from services.ocr_worker.engine_tuning import runners

    inner = setting.engine._pipeline.paddlex_pipeline._pipeline
    for model, runner in zip(("det", "rec"), runners(inner)):
        runner.session = ModelClock(runner.session, setting, model)


def measure() -> dict[str, Any]:
    parts = report.names("BENCH_ACCURACY_PARTS", ",".join(PARTS))
    if unknown := set(parts) - set(PARTS):
        raise SystemExit(f"BENCH_ACCURACY_PARTS: unknown {sorted(unknown)}; parts: {PARTS}")
    # the settings part's engines are freed before the scan-pdf part's fleet starts
    result = run(corpus.corpus(), settings()) if "settings" in parts else {}
    if "scan-pdf" in parts:
        result["scan_pdf"] = scan_pdf()
    return {**result, **report.stamp([s["engine"] for s in result.get("settings", [])]
                                     + result.get("scan_pdf", {}).get("engines", []))}


# ---- the scan-PDF part: scans as images and as image-only PDFs, through the fleet ----------
def scan_pdf() -> dict[str, Any]:
    """Each scan wrapped as a PDF at each SCAN_DPIS (a synthetic scan: at its own resolution),
    checked to hold the scan's pixels; each scan is sent once as an image."""
    quick, dpis, images, measured = report.quick(), corpus.SCAN_DPIS, {}, []
    cases = [(page, dpi) for dpi in dpis
             for name in (corpus.QUICK_SYNTHETIC if quick else corpus.SYNTHETIC)
             if (page := corpus.synthetic_scan(name, dpi)) is not None]
    if not quick and report.knob("BENCH_ACCURACY_SCANS", 1):
        cases += [(page, dpi) for page in corpus.real_scans() for dpi in dpis]
    logs = report.log_dir("accuracy")
    with local_fleet.workers(1, local_fleet.real_worker_env(1), logs) as [worker], \
            local_fleet.gateway([local_fleet.url_of(worker)], logs) as gateway:
        url = local_fleet.url_of(gateway)
        report.say(f"{len(cases)} scans as image and PDF through {url}")
        for page, dpi in cases:
            key, pdf = f"{page.name}@{dpi:g}dpi", corpus.image_only_pdf(page.image, dpi)
            if not corpus.is_pixel_exact(pdf, page.image):
                raise RuntimeError(f"{key}: the PDF does not hold the image's pixels")
            image = images.get((page.name, page.dpi)) or read(
                url, documents.to_png(page.image), page)
            images[(page.name, page.dpi)], as_pdf = image, read(url, pdf, page, "pdf")
            report.say(f"  {key}: image {image['cer']:.4f}, pdf {as_pdf['cer']:.4f}")
            pixels = [page.image.width, page.image.height]
            measured.append({
                "page": page.name, "source": page.source, "scan_dpi": page.dpi, "pdf_dpi": dpi,
                "pixels": pixels, "image": image, "pdf": as_pdf,
                "pdf_image_ratio": _ratio(as_pdf["cer"], image["cer"]),
                "same_pixels": as_pdf["rendered"] == pixels,
                "decoded": corpus.decoded_difference(pdf, page.image),  # in-process decoder
                "much_worse": much_worse(as_pdf["cer"], image["cer"])})
        return summarise_scans(measured, report.engine_info([local_fleet.url_of(worker)]))


def read(url: str, data: bytes, page: corpus.ScanPage, kind: str = "image") -> dict[str, Any]:
    """A one-page `kind` (image or pdf) through the fleet, scored; "rendered": its page size."""
    started = time.perf_counter()
    response = requests.post(f"{url}/ocr", data=make_payload(kind, data, kind, 1).body,
                             timeout=600, headers=JSON_HEADERS)
    seconds, answer = time.perf_counter() - started, response.json()
    if response.status_code != 200 or answer.get("errorCode") != 0:
        raise RuntimeError(f"{kind}: HTTP {response.status_code} {str(answer)[:200]}")
    [result], info = answer["result"]["ocrResults"], answer["result"]["dataInfo"]
    size, texts = info["pages"][0] if kind == "pdf" else info, result["prunedResult"]["rec_texts"]
    score = score_page(texts, page.truth)
    return {"cer": score.cer, "edits": score.edits, "chars": score.chars,
            "word_f1": score.word_f1, "rendered": [size["width"], size["height"]],
            "seconds": round(seconds, 2), "bytes": len(data), "texts": texts}


def much_worse(pdf_cer: float, image_cer: float) -> bool:
    absolute, relative = MUCH_WORSE
    return pdf_cer - image_cer > absolute and pdf_cer > image_cer * (1 + relative)


def _ratio(pdf_cer: float, image_cer: float) -> float | None:
    return pdf_cer / image_cer if image_cer else 1.0 if pdf_cer == 0 else None


def summarise_scans(measured: list[dict[str, Any]], engines: list[dict[str, Any]]
                    ) -> dict[str, Any]:
    def totals(members: list[dict[str, Any]]) -> dict[str, Any]:
        image, pdf = [Score(chars=sum(m[form]["chars"] for m in members),
                            edits=sum(m[form]["edits"] for m in members)).cer
                      for form in ("image", "pdf")]
        return {"pages": len(members), "image": image, "pdf": pdf, "ratio": _ratio(pdf, image),
                "within": pdf <= image * PDF_CER_RATIO_GOAL or pdf - image <= PDF_CER_SLACK}

    by_dpi = {str(dpi): totals([m for m in measured if m["pdf_dpi"] == dpi])
              for dpi in corpus.SCAN_DPIS}
    overall = totals(measured)
    worse = [f"{m['page']}@{m['pdf_dpi']:g}dpi" for m in measured if m["much_worse"]]
    within = all(t["within"] for t in [overall, *by_dpi.values()] if t["pages"])
    return {"cases": measured, "by_dpi": by_dpi, "overall": overall,
            "goal": {"ratio_max": PDF_CER_RATIO_GOAL, "slack": PDF_CER_SLACK,
                     "much_worse": list(MUCH_WORSE), "within_ratio": within,
                     "much_worse_pages": worse, "met": within and not worse},
            "quick": report.quick(), "engines": engines}


def settings_table(result: dict[str, Any]) -> str:
    """Per setting: CER on all pages and per kind (and the change against the reference), word
    F1 and lines changed per kind, CPU per page, verdict."""
    kinds = sorted(result["by_kind"])

    def column(s: dict[str, Any]) -> list[dict[str, Any]]:  # all pages, then each kind
        return [s, *[result["by_kind"][kind][s["label"]] for kind in kinds]]

    lines = [[s["label"], *[f"{a['cer']:.4f} ({a['cer'] - b['cer']:+.4f})"
                            for a, b in zip(column(s), column(result["settings"][0]))],
              " / ".join(f"{k['word_f1']:.3f}" for k in column(s)[1:]),
              " / ".join(f"{k['lines_changed']}/{k['reference_lines']}" for k in column(s)[1:]),
              f"{s['cpu_s_per_page']:.2f} s ({s['speedup']:.2f}x)" + (
                  f": det {s['det_s_per_page']:.2f}, rec {s['rec_s_per_page']:.2f}"
                  if "det_s_per_page" in s else ""),
              "CHOSEN" if s["label"] == result["chosen"] else
              f"CER too high ({', '.join(s['too_far'])})" if s.get("too_far") else "ok"]
             for s in result["settings"]]
    pages = ", ".join(f"{list(result['page_kinds'].values()).count(kind)} {kind}"
                      for kind in kinds)
    return (report.markdown(["setting", "CER all (vs ref)", *[f"CER {kind}" for kind in kinds],
                             f"word F1 ({' / '.join(kinds)})", "lines changed",
                             "CPU/page: in the models", "verdict"], lines) +
            f"\n\nThe default rule: fastest within {rule(result['cer_tolerance'])} of the "
            "reference's CER, on all pages and on each kind -> "
            f"{result['chosen']}. Pages: {pages}. {report.measured(result)}.")


def rule(tolerance: float | dict[str, float]) -> str:
    """The tolerance in words; an older result file has an absolute one."""
    if isinstance(tolerance, dict):
        return f"{tolerance['relative']:.0%}"
    return f"+{tolerance}"


def scan_pdf_table(result: dict[str, Any]) -> str:
    part = result["scan_pdf"]
    lines = [[f"{c['page']}, as a {c['pdf_dpi']}-dpi PDF", "x".join(map(str, c["pixels"])),
              "yes" if c["decoded"]["identical"] else "no", f"{c['image']['cer']:.4f}",
              f"{c['pdf']['cer']:.4f}", f"{c['pdf_image_ratio']:.2f}"] for c in part["cases"]]
    lines += [[f"all pages at {dpi} dpi", "", "", f"{s['image']:.4f}", f"{s['pdf']:.4f}",
               f"{s['ratio']:.2f}"] for dpi, s in part["by_dpi"].items()]
    engine = part["engines"][0] if part["engines"] else {}
    return (report.markdown(["scan", "pixels", "PDF read as the same pixels", "CER as an image",
                             "CER as a PDF", "PDF ÷ image"], lines) +
            "\n\nGoal (within 10 % or +0.001 at each dpi, no page much worse): "
            f"{'met' if part['goal']['met'] else 'missed'}. Engine: {engine.get('engine')} "
            f"{engine.get('det_model')} + {engine.get('rec_model')}, {engine.get('backend')} "
            f"{engine.get('precision')}. {report.measured(result)}.")


def table(result: dict[str, Any]) -> str:
    return "\n\n".join(render(result) for key, render in
                       (("settings", settings_table), ("scan_pdf", scan_pdf_table))
                       if key in result)


def wrong_answers(result: dict[str, Any]) -> int:
    """The scan-PDF goal missed counts as a wrong answer (the run exits 1)."""
    return int("scan_pdf" in result and not result["scan_pdf"]["goal"]["met"])


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
