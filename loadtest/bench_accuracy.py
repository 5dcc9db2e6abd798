"""`make bench-accuracy`, two parts (BENCH_ACCURACY_PARTS). settings (issue 13): CER, word F1,
lines changed against the reference (PaddleOCR as shipped) and CPU seconds per page of each
engine setting on the accuracy corpus, in this process, interleaved page by page; the default is
the fastest setting within CER_TOLERANCE of the reference on all pages and on each kind of page.
scan-pdf (issue 26): scans through a fleet as images and as image-only PDFs of the same pixels.
Method, goals and knobs: docs/benchmarks.md and loadtest/README.md. Writes accuracy.json."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from loadtest import local_fleet, report
from loadtest.accuracy_metrics import Score, changed_lines, score_page
from loadtest.payloads import JSON_HEADERS, make_payload
from samples import accuracy_corpus, documents

CER_TOLERANCE = 0.002
FILE = "accuracy.json"
PDF_CER_RATIO_GOAL = 1.10  # PDFs' CER at most 10 % above the images'
PDF_CER_SLACK = 0.001  # ...or at most this much above (absolute): a near-zero CER's ratio is noise
MUCH_WORSE = (0.01, 0.20)  # a page is read much worse as a PDF: CER up by > 0.01 and > 20 %
PARTS = ("settings", "scan-pdf")


@dataclass
class Setting:
    label: str
    overrides: dict[str, Any]
    fast_ctc: bool = True
    engine: Any = None
    texts: dict[str, list[str]] = field(default_factory=dict)  # page name -> lines read
    cpu_s: float = 0.0
    kind_cpu_s: dict[str, float] = field(default_factory=dict)
    score: Score = field(default_factory=Score)


def settings() -> list[Setting]:
    """The reference first; BENCH_ACCURACY_SETTINGS keeps those whose label holds a word."""
    try:
        from services.ocr_worker import openvino_backend

        bf16 = "BF16" in openvino_backend.cpu_capabilities()
    except ImportError:
        bf16 = False
    made = [Setting("onnxruntime fp32, rec batch 6, PaddleX CTC (reference)",
                    {"backend": "onnxruntime", "rec_batch_size": 6}, fast_ctc=False)]
    made += [Setting(f"onnxruntime fp32, rec batch {b}",
                     {"backend": "onnxruntime", "rec_batch_size": b}) for b in (6, 1, 2)]
    openvino = [("fp32", 6)] + ([("bf16", 6), ("bf16", 2), ("bf16", 1)] if bf16 else [])
    made += [Setting(f"openvino {precision}, rec batch {b}",
                     {"backend": "openvino", "ov_precision": precision, "rec_batch_size": b})
             for precision, b in openvino]
    wanted = report.names("BENCH_ACCURACY_SETTINGS")
    return [s for s in made if not wanted or any(w in s.label for w in wanted)] or made[:1]


def recognise(setting: Setting, image) -> tuple[list[str], float]:
    started = time.process_time()
    texts = setting.engine.predict([image], {})[0].result_json()["rec_texts"]
    return texts, time.process_time() - started


def page_score(setting: Setting, pages) -> Score:
    return sum((score_page(setting.texts[p.name], p.truth) for p in pages), Score())


def too_far(setting: Setting, reference: Setting, kinds: dict[str, list] | None = None
            ) -> list[str]:
    """Where the setting's CER is over the reference's + CER_TOLERANCE: "all" and/or the kinds
    of page (`kinds`: kind -> its pages)."""
    far = ["all"] if setting.score.cer > reference.score.cer + CER_TOLERANCE else []
    for kind, pages in (kinds or {}).items():
        if page_score(setting, pages).cer > page_score(reference, pages).cer + CER_TOLERANCE:
            far.append(kind)
    return far


def chosen(runs: list[Setting], kinds: dict[str, list] | None = None) -> Setting:
    """The fastest setting not too_far from the reference (runs[0])."""
    return min((s for s in runs if not too_far(s, runs[0], kinds)), key=lambda s: s.cpu_s)


def run(pages: list[accuracy_corpus.CorpusPage], runs: list[Setting]) -> dict[str, Any]:
    from services.ocr_worker.config import WorkerConfig
    from services.ocr_worker.engine import PaddleOCREngine

    report.say(f"{len(pages)} pages x {len(runs)} settings")
    for setting in runs:
        setting.engine = PaddleOCREngine(WorkerConfig(threads=1, **setting.overrides))
        setting.engine.load()
        if not setting.fast_ctc:  # back to PaddleX's own CTCLabelDecode
            post_op = setting.engine._pipeline.paddlex_pipeline._pipeline.text_rec_model.post_op
            post_op.__class__ = post_op.__class__.__mro__[1]
        recognise(setting, pages[0].image)  # warm-up, untimed
    for page in pages:
        for setting in runs:
            texts, seconds = recognise(setting, page.image)
            setting.texts[page.name] = texts
            setting.cpu_s += seconds
            setting.kind_cpu_s[page.kind] = setting.kind_cpu_s.get(page.kind, 0.0) + seconds
            setting.score += score_page(texts, page.truth)
    reference = runs[0]
    kinds = {kind: [p for p in pages if p.kind == kind]
             for kind in sorted({p.kind for p in pages})}

    def figures(setting: Setting, members, cpu_s: float) -> dict[str, Any]:
        score = page_score(setting, members)
        return {"cer": score.cer, "word_f1": score.word_f1,
                "lines_changed": sum(changed_lines(setting.texts[p.name],
                                                   reference.texts[p.name]) for p in members),
                "cpu_s_per_page": cpu_s / len(members)}

    return {
        "pages": [p.name for p in pages],
        "page_kinds": {p.name: p.kind for p in pages},
        "reference_lines": sum(len(lines) for lines in reference.texts.values()),
        "settings": [{"label": s.label, "overrides": s.overrides, "fast_ctc": s.fast_ctc,
                      **figures(s, pages, s.cpu_s), "speedup": reference.cpu_s / s.cpu_s,
                      "too_far": too_far(s, reference, kinds), "engine": s.engine.info}
                     for s in runs],
        "by_kind": {kind: {s.label: {**figures(s, members, s.kind_cpu_s.get(kind, 0.0)),
                                     "reference_lines": sum(len(reference.texts[p.name])
                                                            for p in members),
                                     "pages": len(members)} for s in runs}
                    for kind, members in kinds.items()},
        "cer_tolerance": CER_TOLERANCE,
        "chosen": chosen(runs, kinds).label,
        "texts": {s.label: s.texts for s in runs},
    }


def measure() -> dict[str, Any]:
    parts = report.names("BENCH_ACCURACY_PARTS", ",".join(PARTS))
    if unknown := set(parts) - set(PARTS):
        raise SystemExit(f"BENCH_ACCURACY_PARTS: unknown {sorted(unknown)}; parts: {PARTS}")
    result: dict[str, Any] = {}
    engines: list[dict[str, Any]] = []
    if "settings" in parts:
        report.say("rendering the accuracy corpus")
        result = run(accuracy_corpus.corpus(), settings())  # engines freed before the fleet
        engines += [s["engine"] for s in result["settings"]]
    if "scan-pdf" in parts:
        result["scan_pdf"] = scan_pdf()
        engines += result["scan_pdf"]["engines"]
    return {**result, **report.stamp(engines)}


# ---- the scan-PDF part: scans as images and as image-only PDFs, through the fleet ----------
def scan_pdf() -> dict[str, Any]:
    """Each scan wrapped as a PDF at each SCAN_DPIS (a synthetic scan: at its own resolution)."""
    report.say("scan-PDF part: rendering the scans")
    quick, dpis = report.quick(), accuracy_corpus.SCAN_DPIS
    cases = [(page, dpi) for dpi in dpis
             for name in (accuracy_corpus.QUICK_SYNTHETIC if quick else accuracy_corpus.SYNTHETIC)
             if (page := accuracy_corpus.synthetic_scan(name, dpi)) is not None]
    if not quick and os.environ.get("BENCH_ACCURACY_SCANS", "1") != "0":
        cases += [(page, dpi) for page in accuracy_corpus.real_scans() for dpi in dpis]
    logs = report.log_dir("accuracy")
    with local_fleet.workers(1, local_fleet.real_worker_env(1), logs) as [worker], \
            local_fleet.gateway([local_fleet.url_of(worker)], logs) as gateway:
        url = local_fleet.url_of(gateway)
        engines = report.engine_info([local_fleet.url_of(worker)])
        report.say(f"{len(cases)} scans as image and PDF through {url}")
        images: dict[tuple[str, float], dict[str, Any]] = {}  # each scan sent once as an image
        return summarise_scans([measure_case(url, page, dpi, images) for page, dpi in cases],
                               engines)


def measure_case(url: str, page: accuracy_corpus.ScanPage, pdf_dpi: float,
                 images: dict[tuple[str, float], dict[str, Any]]) -> dict[str, Any]:
    key, pixels = f"{page.name}@{pdf_dpi:g}dpi", [page.image.width, page.image.height]
    pdf = accuracy_corpus.image_only_pdf(page.image, pdf_dpi)
    if not accuracy_corpus.is_pixel_exact(pdf, page.image):
        raise RuntimeError(f"{key}: the PDF does not hold the image's pixels")
    if (page.name, page.dpi) not in images:
        images[(page.name, page.dpi)] = read(url, documents.to_png(page.image), "image", page)
    image, as_pdf = images[(page.name, page.dpi)], read(url, pdf, "pdf", page)
    report.say(f"  {key}: image {image['cer']:.4f}, pdf {as_pdf['cer']:.4f}"
               f" (PDF rendered {as_pdf['rendered']})")
    return {"page": page.name, "source": page.source, "scan_dpi": page.dpi, "pdf_dpi": pdf_dpi,
            "pixels": pixels, "image": image, "pdf": as_pdf,
            "pdf_image_ratio": _ratio(as_pdf["cer"], image["cer"]),
            "same_pixels": as_pdf["rendered"] == pixels,
            "decoded": accuracy_corpus.decoded_difference(pdf, page.image),  # in-process decoder
            "much_worse": much_worse(as_pdf["cer"], image["cer"])}


def read(url: str, data: bytes, kind: str, page: accuracy_corpus.ScanPage) -> dict[str, Any]:
    """A one-page `kind` (image or pdf) through the fleet, scored; "rendered": its page size."""
    started = time.perf_counter()
    response = requests.post(f"{url}/ocr", data=make_payload(kind, data, kind, 1).body,
                             timeout=600, headers=JSON_HEADERS)
    seconds, answer = time.perf_counter() - started, response.json()
    if response.status_code != 200 or answer.get("errorCode") != 0:
        raise RuntimeError(f"{kind}: HTTP {response.status_code} {str(answer)[:200]}")
    [result], info = answer["result"]["ocrResults"], answer["result"]["dataInfo"]
    size = info["pages"][0] if kind == "pdf" else info
    texts = result["prunedResult"]["rec_texts"]
    score = score_page(texts, page.truth)
    return {"cer": score.cer, "edits": score.edits, "chars": score.chars,
            "word_f1": score.word_f1, "rendered": [size["width"], size["height"]],
            "seconds": round(seconds, 2), "bytes": len(data), "texts": texts}


def much_worse(pdf_cer: float, image_cer: float) -> bool:
    absolute, relative = MUCH_WORSE
    return pdf_cer - image_cer > absolute and pdf_cer > image_cer * (1 + relative)


def _ratio(pdf_cer: float, image_cer: float) -> float | None:
    if image_cer == 0:
        return 1.0 if pdf_cer == 0 else None
    return pdf_cer / image_cer


def summarise_scans(measured: list[dict[str, Any]], engines: list[dict[str, Any]]
                    ) -> dict[str, Any]:
    def totals(members: list[dict[str, Any]]) -> dict[str, Any]:
        image, pdf = [Score(chars=sum(m[form]["chars"] for m in members),
                            edits=sum(m[form]["edits"] for m in members)).cer
                      for form in ("image", "pdf")]
        return {"pages": len(members), "image": image, "pdf": pdf, "ratio": _ratio(pdf, image),
                "within": pdf <= image * PDF_CER_RATIO_GOAL or pdf - image <= PDF_CER_SLACK}

    by_dpi = {str(dpi): totals([m for m in measured if m["pdf_dpi"] == dpi])
              for dpi in accuracy_corpus.SCAN_DPIS}
    overall = totals(measured)
    worse = [f"{m['page']}@{m['pdf_dpi']:g}dpi" for m in measured if m["much_worse"]]
    within = all(t["within"] for t in [overall, *by_dpi.values()] if t["pages"])
    return {"cases": measured, "by_dpi": by_dpi, "overall": overall,
            "goal": {"ratio_max": PDF_CER_RATIO_GOAL, "slack": PDF_CER_SLACK,
                     "much_worse": list(MUCH_WORSE), "within_ratio": within,
                     "much_worse_pages": worse, "met": within and not worse},
            "quick": report.quick(), "engines": engines}


def rows(result: dict[str, Any]) -> list[list[Any]]:
    """settings_table's rows: per setting, CER on all pages and per kind (and the change against
    the reference), word F1 and lines changed per kind, CPU, verdict."""
    if "settings" not in result:
        return []
    reference, made = result["settings"][0], []
    kinds = [result["by_kind"][kind] for kind in sorted(result["by_kind"])]
    for s in result["settings"]:
        mine = [s, *[k[s["label"]] for k in kinds]]
        base = [reference, *[k[reference["label"]] for k in kinds]]
        far = s.get("too_far", [])
        made.append([s["label"],
                     *[f"{a['cer']:.4f} ({a['cer'] - b['cer']:+.4f})" for a, b in zip(mine, base)],
                     " / ".join(f"{k['word_f1']:.3f}" for k in mine[1:]),
                     " / ".join(f"{k['lines_changed']}/{k['reference_lines']}" for k in mine[1:]),
                     f"{s['cpu_s_per_page']:.2f} s ({s['speedup']:.2f}x)",
                     "CHOSEN" if s["label"] == result["chosen"] else
                     f"CER too high ({', '.join(far)})" if far else "ok"])
    return made


def settings_table(result: dict[str, Any]) -> str:
    kinds = sorted(result["by_kind"])
    headers = ["setting", "CER all (vs ref)", *[f"CER {kind}" for kind in kinds],
               f"word F1 ({' / '.join(kinds)})", "lines changed", "CPU/page", "verdict"]
    pages = ", ".join(f"{list(result['page_kinds'].values()).count(kind)} {kind}"
                      for kind in kinds)
    return (report.markdown(headers, rows(result)) + "\n\nThe default rule: fastest within CER "
            f"+{result['cer_tolerance']} of the reference, on all pages and on each kind -> "
            f"{result['chosen']}. Pages: {pages}. {report.measured(result)}.")


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
    part = result.get("scan_pdf")
    return 0 if part is None or part["goal"]["met"] else 1


if __name__ == "__main__":
    sys.exit(report.main(sys.modules[__name__]))
