"""The figures tables in the docs, generated from the committed result files under
docs/figures/ (`python -m loadtest.doc_tables` rewrites them; tests/test_doc_tables.py fails
when a table and its file disagree). A table lives between `<!-- NAME: ... -->` and
`<!-- /NAME -->` in its document."""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Callable

from loadtest import report
from scripts.fleet import REPO_ROOT

FIGURES = REPO_ROOT / "docs" / "figures"


def fleet_table(result: dict[str, Any]) -> str:
    rows = [[f"{s['mode']}, {s['replicas']} replicas, {s['gateways']} gateway(s)",
             f"{s['page_ms'] / 1000:g} s", s["efficiency"], s["efficiency_makespan"],
             s["finish_spread"], s["image_p95_s"], s["image_p95_wait_s"],
             f"{s['documents_ok']}/{s['documents']}, {s['images_ok']}/{s['images']}",
             s["gateway_cpu_ms_per_page"], s["machine_busy"]] for s in result["shapes"]]
    lines = [_markdown(["shape", "page time", "pages/s ÷ capacity (documents running)",
                        "the same over the makespan", "finish spread", "image p95 (s)",
                        "image p95 beyond one page (s)", "documents, images right",
                        "gateway CPU ms/page", "machine busy"], rows)]
    for growth in result.get("growth", []):
        lines.append(f"\nGrowth 16 → 64 replicas mid-run ({growth['mode']}): the new capacity "
                     f"was reached {growth['seconds_to_new_capacity']} s after the new "
                     f"replicas were ready; 64 → 32 at {growth['shrunk_at_s']} s; documents "
                     f"{growth['documents_ok']}/{growth['documents']} whole.")
    route = result.get("route")
    if route:
        lines.append(f"\nRouting: {route['pages_per_gateway_core_s']} small pages per gateway "
                     f"CPU-second ({route['pages_per_s']} pages/s through one gateway process, "
                     f"{route['failures']} failed).")
    lines.append(f"\nMeasured {result['measured_at']} at commit {result.get('commit', '?')} "
                 f"on {result['machine']['cpus']} × {result['machine']['cpu_model']}: "
                 f"`{result['command']}`.")
    return "\n".join(lines)


def gateway_memory_table(result: dict[str, Any]) -> str:
    most = max(r["pages"] for r in result["formats"])
    fewer = {(r["format"], r["visualize"]): r["peak_growth_mb"] for r in result["formats"]
             if r["pages"] != most}
    rows = [[r["format"], "on" if r["visualize"] else "off", r["answer_mb"],
             r["peak_growth_mb"], fewer[(r["format"], r["visualize"])], r["peak_mb"]]
            for r in result["formats"] if r["pages"] == most]
    uploads = [[u["body"], f"{u['uploads']} x {u['upload_mb']} MB", u["answered_200"],
                u["answered_429"], u["peak_growth_mb"], u["peak_mb"]]
               for u in result["uploads"]]
    return "\n".join([
        _markdown(["format", "visualize", f"answer MB ({most} pages)",
                   f"peak +MB ({most} pages)", f"peak +MB ({most // 10} pages)",
                   "peak RSS MB"], rows), "",
        _markdown(["uploads at once", "size", "200", "429", "peak +MB", "peak RSS MB"],
                  uploads),
        f"\nMeasured {result['measured_at']} at commit {result.get('commit', '?')} on "
        f"{result['machine']['cpus']} × {result['machine']['cpu_model']}: "
        f"`{result['command']}` (gateway: {result['gateway_env']})."])


def scan_pdf_table(result: dict[str, Any]) -> str:
    part = result["scan_pdf"]
    rows = [[f"{c['page']}, as a {c['pdf_dpi']}-dpi PDF", "x".join(map(str, c["pixels"])),
             "yes" if c["decoded"]["identical"] else "no", f"{c['image']['cer']:.4f}",
             f"{c['pdf']['cer']:.4f}", f"{c['pdf_image_ratio']:.2f}"] for c in part["cases"]]
    rows += [[f"all pages at {dpi} dpi", "", "", f"{s['image']:.4f}", f"{s['pdf']:.4f}",
              f"{s['ratio']:.2f}"] for dpi, s in part["by_dpi"].items()]
    engine = part["engines"][0] if part["engines"] else {}
    return "\n".join([
        _markdown(["scan", "pixels", "PDF read as the same pixels", "CER as an image",
                   "CER as a PDF", "PDF ÷ image"], rows),
        f"\nGoal (within 10 % or +0.001 at each dpi, no page much worse): "
        f"{'met' if part['goal']['met'] else 'missed'}. Engine: {engine.get('engine')} "
        f"{engine.get('det_model')} + {engine.get('rec_model')}, {engine.get('backend')} "
        f"{engine.get('precision')}. Measured {result['measured_at']} at commit "
        f"{result.get('commit', '?')} on {result['machine']['cpus']} × "
        f"{result['machine']['cpu_model']}: `{result['command']}`."])


def _markdown(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[report._fmt(v) for v in row] for row in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    out += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(out)


# (document, table name, result file, renderer)
TABLES: list[tuple[str, str, str, Callable[[dict[str, Any]], str]]] = [
    ("docs/capacity.md", "fleet-table", "fleet.json", fleet_table),
    ("docs/capacity.md", "fleet-before", "fleet-before.json", fleet_table),
    ("docs/capacity.md", "gateway-memory", "gateway-memory.json", gateway_memory_table),
    ("docs/capacity.md", "gateway-memory-before", "gateway-memory-before.json",
     gateway_memory_table),
    ("docs/benchmarks.md", "scan-pdf", "scan-pdf-accuracy.json", scan_pdf_table),
]


def rendered(document: str, name: str, result_file: str, render) -> tuple[str, str]:
    """(the document as it is, the document with the table regenerated)."""
    path = REPO_ROOT / document
    text = path.read_text()
    table = render(json.loads((FIGURES / result_file).read_text()))
    pattern = re.compile(rf"(<!-- {name}:[^>]*-->\n).*?(<!-- /{name} -->)"
                         rf"|(<!-- {name}:[^>]*-->)\n?", re.S)
    match = pattern.search(text)
    if match is None:
        raise ValueError(f"{document} has no <!-- {name}: ... --> marker")
    head = match.group(1) or match.group(3) + "\n"
    return text, text[:match.start()] + head + table + f"\n<!-- /{name} -->" + \
        text[match.end():]


def main() -> int:
    for document, name, result_file, render in TABLES:
        old, new = rendered(document, name, result_file, render)
        if old != new:
            (REPO_ROOT / document).write_text(new)
            print(f"rewrote the {name} table in {document}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
