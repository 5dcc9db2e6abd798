"""`make bench-layout` (issue 50): `POST /layout-parsing` on one worker, in this process (the
worker's Flask app and its real pipeline: OCR, the layout model, SLANet_plus and the ruled-table
line model), on

- the table corpus (loadtest/table_corpus.py): ruled, unruled and spanning tables at 150 and
  300 dpi, clean and degraded like scans; TEDS and structure-only TEDS (loadtest/teds.py) of
  each page's first table against its HTML. Goals: >= 0.9 ruled, >= 0.8 unruled;
- the accuracy corpus's born-digital pages (samples/layout_regions.py: their regions known by
  construction): region F1 per class (title, text, table) at IoU >= 0.5, of the answer's
  blocks (parsing_res_list) and of the layout model's own boxes (layout_det_res). Goal >= 0.8;
- the same pages through `/ocr` and `/layout-parsing` in turn: pages/s of one worker each.

Knobs: BENCH_LAYOUT_TABLES (tables per kind, 4; quick 1), BENCH_LAYOUT_DPIS (150,300; quick
150), BENCH_LAYOUT_PAGES (region pages, 0 = all; quick 2). Writes layout.json under
RESULTS_DIR and, unless BENCH_QUICK, docs/figures/layout.json."""

from __future__ import annotations

import base64
import io
import json
import statistics
import sys
import time
from typing import Any

import cv2
import numpy as np
from PIL import Image

from loadtest import report, table_corpus, teds
from scripts.fleet import REPO_ROOT
from services.layout import ruled

FILE = "layout.json"
TEDS_GOALS = {"ruled": 0.9, "unruled": 0.8}
F1_GOAL = 0.8
IOU = 0.5
CLASS_OF = {"doc_title": "title", "paragraph_title": "title", "text": "text", "table": "table"}
# CDLA's "reference" (a bibliography's entries) is body text to a reader, and the Markdown
# keeps it as text: the "lenient" figures count it as text
LENIENT = {**CLASS_OF, "reference": "text"}

Settings = report.settings("LayoutSettings", {
    "tables": (4, "BENCH_LAYOUT_TABLES"),
    "dpis": ([150, 300], "BENCH_LAYOUT_DPIS", report.int_list),
    "pages": (0, "BENCH_LAYOUT_PAGES"),
    "degraded": ([False, True], None),
}, tables=1, dpis=[150], pages=2)


def _png(image: Image.Image | np.ndarray) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(cv2.cvtColor(image, cv2.COLOR_BGR2RGB))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


class Worker:
    """One worker's app in this process, on the engine its environment sets (OCR_*)."""

    def __init__(self):
        from services.ocr_worker.app import create_app
        from services.ocr_worker.config import WorkerConfig

        self.app = create_app(WorkerConfig(warmup=False))
        self.service = self.app.extensions["ocr_service"]
        if not self.service.batcher.ready.wait(300):
            raise RuntimeError("the worker's engine did not get ready in 300 s")
        self.client = self.app.test_client()
        self.failures: list[str] = []

    def engine(self) -> dict[str, str]:
        return (self.client.get("/readyz").get_json() or {}).get("engine") or {}

    def post(self, route: str, image_bytes: bytes, name: str) -> tuple[dict | None, float]:
        """(the answer's result, wall seconds); self.cpu_s: the CPU seconds this process spent
        on it (the worker's threads: on a shared machine, what the page costs a core)."""
        body = {"file": base64.b64encode(image_bytes).decode("ascii"), "fileType": 1,
                "visualize": False}
        started, cpu = time.perf_counter(), time.process_time()
        response = self.client.post(route, json=body)
        seconds = time.perf_counter() - started
        self.cpu_s = time.process_time() - cpu
        if response.status_code != 200:
            self.failures.append(f"{route} {name}: {response.status_code} "
                                 f"{response.get_data(as_text=True)[:200]}")
            return None, seconds
        return response.get_json()["result"], seconds

    def close(self) -> None:
        self.service.shutdown(5)


def measure_tables(worker: Worker, settings) -> list[dict[str, Any]]:
    out = []
    for item in table_corpus.images(settings.tables, settings.dpis, settings.degraded):
        truth = item.spec.html()
        data = _png(item.image) if not item.degraded else _jpeg_bytes(item.image)
        result, seconds = worker.post("/layout-parsing", data, item.name)
        pruned = result["layoutParsingResults"][0]["prunedResult"] if result else {}
        found = [b for b in pruned.get("parsing_res_list", []) if b["block_label"] == "table"]
        # one table a page: the answer's largest table block is its reading of it
        chosen = max(found, key=lambda b: (b["block_bbox"][2] - b["block_bbox"][0])
                     * (b["block_bbox"][3] - b["block_bbox"][1]), default=None)
        predicted = chosen["block_content"] if chosen else ""
        line_model = None
        if chosen:
            x0, y0, x1, y1 = chosen["block_bbox"]
            pixels = cv2.cvtColor(np.asarray(item.image), cv2.COLOR_RGB2BGR)
            line_model = ruled.is_ruled(pixels[max(0, y0):y1, max(0, x0):x1])
        out.append({"name": item.name, "kind": item.spec.kind, "dpi": item.dpi,
                    "degraded": item.degraded, "booktabs": item.spec.booktabs,
                    "tables_found": len(found), "ruled_path": line_model,
                    "teds": teds.teds(predicted, truth),
                    "teds_structure": teds.teds(predicted, truth, structure_only=True),
                    "seconds": round(seconds, 3), "predicted": predicted, "truth": truth})
        report.say(f"  {item.name}: TEDS {out[-1]['teds']:.3f} "
                   f"(structure {out[-1]['teds_structure']:.3f}), {seconds:.1f} s")
    return out


def _jpeg_bytes(image: Image.Image) -> bytes:
    """A degraded page as it was made: JPEG (table_corpus.degrade decodes its own JPEG; this
    sends the same pixels at quality 95 so nothing more is lost)."""
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def measure_regions(worker: Worker, settings) -> dict[str, Any]:
    from samples import layout_regions

    pages = layout_regions.pages()
    if settings.pages:
        pages = pages[:settings.pages]
    counts = {kind: {c: [0, 0, 0] for c in layout_regions.CLASSES}
              for kind in ("blocks", "model", "blocks_lenient")}
    per_page, ocr_s, layout_s, ocr_cpu, layout_cpu = [], [], [], [], []
    worker.post("/ocr", _png(pages[0].image), "warm-up")
    worker.post("/layout-parsing", _png(pages[0].image), "warm-up")
    for number, page in enumerate(pages):
        data = _png(page.image)
        timed = {}
        cpu = {}
        for route in (("/ocr", "/layout-parsing") if number % 2 == 0
                      else ("/layout-parsing", "/ocr")):
            timed[route] = worker.post(route, data, page.name)
            cpu[route] = worker.cpu_s
        ocr_s.append(timed["/ocr"][1])
        layout_s.append(timed["/layout-parsing"][1])
        ocr_cpu.append(cpu["/ocr"])
        layout_cpu.append(cpu["/layout-parsing"])
        result = timed["/layout-parsing"][0]
        pruned = result["layoutParsingResults"][0]["prunedResult"] if result else {}
        found = {"blocks": [(CLASS_OF.get(b["block_label"]), b["block_bbox"])
                            for b in pruned.get("parsing_res_list", [])],
                 "blocks_lenient": [(LENIENT.get(b["block_label"]), b["block_bbox"])
                                    for b in pruned.get("parsing_res_list", [])],
                 "model": [(CLASS_OF.get(b["label"]), b["coordinate"])
                           for b in pruned.get("layout_det_res", {}).get("boxes", [])]}
        entry = {"name": page.name, "truth": {c: sum(1 for k, _ in page.regions if k == c)
                                              for c in layout_regions.CLASSES},
                 "labels": [[b["block_label"], b["block_bbox"]]
                            for b in pruned.get("parsing_res_list", [])]}
        for kind, boxes in found.items():
            entry[kind] = {}
            for c in layout_regions.CLASSES:
                predicted = [box for k, box in boxes if k == c]
                truth = [box for k, box in page.regions if k == c]
                hits = teds.match(predicted, truth, IOU)
                entry[kind][c] = [hits, len(predicted), len(truth)]
                for i, v in enumerate((hits, len(predicted), len(truth))):
                    counts[kind][c][i] += v
        per_page.append(entry)
        report.say(f"  {page.name}: /ocr {timed['/ocr'][1]:.2f} s, /layout-parsing "
                   f"{timed['/layout-parsing'][1]:.2f} s, blocks {entry['blocks']}")
    return {"pages": per_page, "iou": IOU,
            "f1": {kind: {c: teds.f1(*v) for c, v in by.items()} for kind, by in counts.items()},
            "speed": {"pages": len(pages), "ocr_s": [round(s, 3) for s in ocr_s],
                      "layout_s": [round(s, 3) for s in layout_s],
                      "ocr_cpu_s": [round(s, 3) for s in ocr_cpu],
                      "layout_cpu_s": [round(s, 3) for s in layout_cpu],
                      "ocr_pages_per_s": len(ocr_s) / sum(ocr_s),
                      "layout_pages_per_s": len(layout_s) / sum(layout_s),
                      "ocr_pages_per_cpu_s": len(ocr_cpu) / sum(ocr_cpu),
                      "layout_pages_per_cpu_s": len(layout_cpu) / sum(layout_cpu)}}


def summary(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean TEDS per (kind, dpi, clean/degraded)."""
    groups: dict[tuple, list[dict]] = {}
    for t in tables:
        groups.setdefault((t["kind"], t["dpi"], t["degraded"]), []).append(t)
    return [{"kind": kind, "dpi": dpi, "degraded": degraded, "tables": len(members),
             "teds": statistics.mean(t["teds"] for t in members),
             "teds_structure": statistics.mean(t["teds_structure"] for t in members),
             "found": sum(t["tables_found"] > 0 for t in members),
             "ruled_path": sum(bool(t.get("ruled_path")) for t in members),
             "teds_where_found": statistics.mean([t["teds"] for t in members
                                                  if t["tables_found"]] or [0.0])}
            for (kind, dpi, degraded), members in sorted(
                groups.items(), key=lambda g: (table_corpus.KINDS.index(g[0][0]), g[0][1],
                                               g[0][2]))]


def measure(settings=None) -> dict[str, Any]:
    settings = settings or Settings.from_env()
    started = time.monotonic()
    worker = Worker()
    try:
        engine = worker.engine()
        report.say("== the table corpus ==")
        tables = measure_tables(worker, settings)
        report.say("== regions and pages/s on the accuracy corpus's born-digital pages ==")
        regions = measure_regions(worker, settings)
    finally:
        worker.close()
    by_kind = {kind: statistics.mean(t["teds"] for t in tables if t["kind"] == kind)
               for kind in table_corpus.KINDS if any(t["kind"] == kind for t in tables)}
    return {"settings": {"tables_per_kind": settings.tables, "dpis": settings.dpis,
                         "degraded": settings.degraded, "pages": settings.pages},
            "teds_summary": summary(tables), "teds_by_kind": by_kind, "tables": tables,
            "regions": regions, "goals": {"teds": TEDS_GOALS, "f1": F1_GOAL},
            "failures": len(worker.failures), "failure_samples": worker.failures[:5],
            "seconds": round(time.monotonic() - started, 1), **report.stamp([engine])}


def _verdict(value: float, goal: float | None) -> str:
    return "-" if goal is None else ("PASS" if value >= goal else "FAIL")


def table(result: dict[str, Any]) -> str:
    teds_rows = [[s["kind"], s["dpi"], "degraded" if s["degraded"] else "clean",
                  f"{s['found']}/{s['tables']}", f"{s.get('ruled_path', '-')}/{s['found']}",
                  s["teds"], s["teds_structure"],
                  s["teds_where_found"] if s["found"] else None,
                  f">= {TEDS_GOALS[s['kind']]}" if s["kind"] in TEDS_GOALS else "(reported)",
                  _verdict(s["teds"], TEDS_GOALS.get(s["kind"]))]
                 for s in result["teds_summary"]]
    f1 = result["regions"]["f1"]
    region_rows = [[c, f"{f1['blocks'][c]['tp']}/{f1['blocks'][c]['predicted']}/"
                       f"{f1['blocks'][c]['truth']}", f1["blocks"][c]["precision"],
                    f1["blocks"][c]["recall"], f1["blocks"][c]["f1"], f1["model"][c]["f1"],
                    f1["blocks_lenient"][c]["f1"], f">= {F1_GOAL}",
                    _verdict(f1["blocks"][c]["f1"], F1_GOAL)]
                   for c in f1["blocks"]]
    speed = result["regions"]["speed"]
    means = ", ".join(f"{kind} {value:.3f}" for kind, value in result["teds_by_kind"].items())
    return "\n".join([
        report.markdown(["tables", "dpi", "scan", "table found", "to the line model", "TEDS",
                         "TEDS structure",
                         "TEDS where found", "goal", "verdict"], teds_rows),
        f"\nMean TEDS: {means}. Each page is an A4 page (caption, table, a paragraph) at the "
        f"dpi shown, {result['settings']['tables_per_kind']} tables of each kind; a table the "
        f"layout model does not find scores 0; where it finds several, the largest is "
        f"scored.\n",
        report.markdown(["region class", "matched/answered/true", "precision", "recall",
                         "F1 (answer's blocks)", "F1 (layout model's boxes)",
                         "F1 (blocks, reference as text)", "goal", "verdict"], region_rows),
        f"\nRegions at IoU >= {result['regions']['iou']}, one to one, on "
        f"{len(result['regions']['pages'])} born-digital pages of the accuracy corpus. "
        f"One worker (1 thread), {speed['pages']} such pages (144 dpi PNG, `visualize` off) "
        f"sent in turn: /layout-parsing {_per_cpu(speed, 'layout')}, /ocr "
        f"{_per_cpu(speed, 'ocr')} on the same pages ({_ratio(speed)}); pages per CPU-second "
        f"of the worker's process are its pages/s on a core of its own. The machine's load "
        f"(1-minute average) was {result['load']['loadavg_1m_start']:.1f}-"
        f"{result['load']['loadavg_1m_max']:.1f} on {result['load']['cores']} cores. "
        f"Engine: {report.engine_label(result.get('engines') or [])}. "
        f"{report.measured(result)}."])


def _per_cpu(speed: dict[str, Any], route: str) -> str:
    if f"{route}_pages_per_cpu_s" not in speed:
        return f"{speed[f'{route}_pages_per_s']:.3f} pages/s"
    return (f"{speed[f'{route}_pages_per_cpu_s']:.3f} pages per CPU-second "
            f"({speed[f'{route}_pages_per_s']:.3f} pages/s wall)")


def _ratio(speed: dict[str, Any]) -> str:
    key = "pages_per_cpu_s" if "ocr_pages_per_cpu_s" in speed else "pages_per_s"
    return f"{speed[f'layout_{key}'] / speed[f'ocr_{key}']:.2f}x"


def rows(result: dict[str, Any]) -> list[list[Any]]:
    made = [[f"layout TEDS, {kind}", f"{value:.3f}",
             f">= {TEDS_GOALS[kind]}" if kind in TEDS_GOALS else "(reported)",
             _verdict(value, TEDS_GOALS.get(kind)) if kind in TEDS_GOALS else "info"]
            for kind, value in result["teds_by_kind"].items()]
    f1 = result["regions"]["f1"]["blocks"]
    made.append(["layout region F1 (title/text/table)",
                 "/".join(f"{f1[c]['f1']:.2f}" for c in f1), f">= {F1_GOAL}",
                 _verdict(min(f1[c]["f1"] for c in f1), F1_GOAL)])
    speed = result["regions"]["speed"]
    made.append(["layout vs /ocr pages per CPU-second, one worker",
                 f"{speed.get('layout_pages_per_cpu_s', 0):.3f} vs "
                 f"{speed.get('ocr_pages_per_cpu_s', 0):.3f} ({_ratio(speed)})",
                 "(reported)", "info"])
    return made


def main() -> int:
    result, _ = report.run(sys.modules[__name__])
    print(table(result))
    if not report.quick():
        figures = REPO_ROOT / "docs" / "figures" / FILE
        figures.write_text(json.dumps(result, indent=2) + "\n")
        report.say(f"wrote {figures}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
