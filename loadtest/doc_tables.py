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


def measured(result: dict[str, Any]) -> str:
    """Where a result came from (report.stamp), as the sentence every table ends with."""
    return (f"Measured {result['measured_at']} at commit {result.get('commit', '?')} on "
            f"{result['machine']['cpus']} × {result['machine']['cpu_model']}: "
            f"`{result['command']}`")


def fleet_table(result: dict[str, Any]) -> str:
    rows = [[f"{s['mode']}, {s['replicas']} replicas, {s['gateways']} gateway(s)",
             f"{s['page_ms'] / 1000:g} s", s["efficiency"], s["efficiency_makespan"],
             s["finish_spread"], s["image_p95_s"], s["image_p95_wait_s"],
             f"{s['documents_ok']}/{s['documents']}, {s['images_ok']}/{s['images']}",
             s["gateway_cpu_ms_per_page"], s["machine_busy"]] for s in result["shapes"]]
    lines = [_markdown(["shape", "page time", "pages/s ÷ capacity (documents running)",
                        "the same over the makespan", "finish spread", "image p95 (s)",
                        "image p95 beyond its own time (s)", "documents, images right",
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
    lines.append(f"\n{measured(result)}.")
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
        f"\n{measured(result)} (gateway: {result['gateway_env']})."])


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
        f"{engine.get('precision')}. {measured(result)}."])


def scaling_table(result: dict[str, Any]) -> str:
    rows = [[n, f"{pps:.2f}", "-" if eff is None else f"{eff:.3f}",
             f">= {goal:.2f}" if goal else "(base)", f"{latency:.2f} s", f"{ideal:.2f} s",
             f"<= {latency_goal:.2f} s", f"{ideal + cpu:.2f} s"]
            for n, pps, eff, goal, latency, ideal, latency_goal, cpu in zip(
                result["replicas"], result["pages_per_s"], result["efficiency"],
                result["efficiency_goal"], result["pdf_latency_s"],
                result["pdf_latency_ideal_s"], result["pdf_latency_goal_s"],
                result["pdf_cpu_bound_s"])]
    return "\n".join([
        _markdown(["replicas", "pages/s", "efficiency", "goal",
                   f"one {result['pdf_pages']}-page PDF alone", "ideal", "goal",
                   "ideal + the PDF's CPU over the cores"], rows),
        f"\nEngine: {result['engine']}. {measured(result)}."])


def cache_table(result: dict[str, Any]) -> str:
    names = [("pdf40_of_4_uncached", "40-page PDF of 4 distinct pages, `no-store`"),
             ("pdf40_of_4_cold", "the same, cold cache"), ("pdf40_of_4_warm", "the same, warm"),
             ("batch_first", "{batch}-page PDF, first read"),
             ("batch_rerun", "{batch}-page PDF, re-run")]
    fleets = result["fleets"]
    rows = [[label.format(batch=fleets[0]["batchPages"])]
            + [cell for fleet in fleets
               for cell in (f"{fleet['runs'][name]['seconds']:.2f} s",
                            fleet["runs"][name]["pagesRead"],
                            fleet["runs"][name]["cachedPages"])]
            for name, label in names]
    head = ["run"] + [f"{f['engine']}: {column}" for f in fleets
                      for column in ("time", "pages read", "from the cache")]
    misses = [[m["store"], f"{m['digestMs']:.2f} ms", f"{m['storeMs']:.2f} ms",
               f"{m['missMs']:.2f} ms"]
              + [f"{100 * m['shareOfPage'][f['engine']]:.2f} %" for f in fleets]
              for m in result["miss"]]
    engines = "; ".join(
        f"{f['engine']}: {f['workers']} workers, " + (
            f"{report.engine_label(f['engines'])}, " if f["engine"] != "sim" else "")
        + f"{f['enginePageMs']:g} ms of engine time per page" for f in fleets)
    return "\n".join([
        _markdown(head, rows), "",
        _markdown(["store", "digest", "store round trips", "miss"]
                  + [f"share of a {f['engine']} page" for f in fleets], misses),
        f"\nEngines: {engines}. {measured(result)}."])


def paddlex_table(result: dict[str, Any], refuse: bool = True) -> str:
    """The side by side with PaddleX's serving. `refuse`: a run that is not publishable
    (a side scaled negatively, or other processes took the cores) raises instead."""
    verdict = result["publishable"]
    if refuse and not verdict["ok"]:
        raise ValueError("this PaddleX run is not publishable: " + "; ".join(verdict["reasons"]))
    sides, best, pdf = result["sides"], result["strongest_paddlex"], result["pdf_latency_s"]
    rows = [[side, f"{figures['1 client']['pages_per_s']:.3f}",
             f"{figures['4 clients']['pages_per_s']:.3f}", f"{pdf[side]:.1f} s",
             f"{max(r['other_load_cores'] for r in figures.values()):.2f}"]
            for side, figures in sides.items()]
    ratios = [[side, f"{r['1 client']:.2f}x", f"{r['4 clients']:.2f}x",
               f"{r['pdf_latency']:.2f}x"] for side, r in result["ratio"].items()]
    return "\n".join([
        _markdown(["side", "pages/s, 1 client", "pages/s, 4 clients",
                   f"{result['pdf_pages']}-page PDF (best of 2)", "other load (cores, worst)"],
                  rows), "",
        _markdown(["ocrfleet ÷ PaddleX's strongest setup for each figure",
                   f"1 client ({best['1 client']})", f"4 clients ({best['4 clients']})",
                   f"PDF latency ({best['pdf']})"], ratios),
        f"\nPublishable: {'yes' if verdict['ok'] else 'NO: ' + '; '.join(verdict['reasons'])} "
        f"({verdict['rules']}). ocrfleet: {result['ocrfleet_setup']}; engines: "
        + "; ".join(f"{side}: {label}" for side, label in result["ocrfleet_engine"].items())
        + f". {measured(result)}."])


def accuracy_table(result: dict[str, Any]) -> str:
    """The engine settings on the accuracy corpus (bench_accuracy's settings part)."""
    from loadtest import bench_accuracy

    return "\n".join([
        _markdown(bench_accuracy.headers(result), bench_accuracy.rows(result)),
        f"\nThe {bench_accuracy.rule(result)}. Pages: "
        + ", ".join(f"{len([k for k in result['page_kinds'].values() if k == kind])} {kind}"
                    for kind in sorted(result["by_kind"]))
        + f". {measured(result)}."])


def memory_table(result: dict[str, Any]) -> str:
    """The worker's memory soak (bench_memory): steady RSS by page count, and the peak."""
    runs = [("worker now (defaults)", result)]
    if result.get("reference"):
        runs.append((f"before: {result['reference']['settings']}", result["reference"]))
    counts = sorted({int(n) for _, run in runs for n in run["steady_mib_at"]})
    rows = [[label, round(run["rss_mib_after_start"])]
            + [round(run["steady_mib_at"][str(n)]) if str(n) in run["steady_mib_at"] else ""
               for n in counts] + [round(run["peak_mib"])] for label, run in runs]
    kinds = ", ".join(f"{kind} {mib:,.0f}" for kind, mib in
                      sorted(result["peak_mib_by_kind"].items(), key=lambda kv: -kv[1]))
    return "\n".join([
        _markdown(["MiB", "after start"] + [f"page {n}" for n in counts] + ["peak"], rows),
        f"\nGrowth from the round ending at page {result['steady_growth_after']} to the last "
        f"round: {result['steady_growth'] * 100:+.1f} % (goal < "
        f"{result['growth_goal'] * 100:.0f} %). The peak is "
        f"{result['peak_share_of_limit'] * 100:.0f} % of the CPU overlay's "
        f"{result['limit_mib'] / 1024:g} GiB limit (goal <= "
        f"{(1 - result['headroom_goal']) * 100:.0f} %). Peaks by kind: {kinds}. Engine: "
        f"{result['engine']}. {measured(result)}."])


def memory_sources_table(result: dict[str, Any]) -> str:
    """Where a worker's memory goes (memory_sources): the allocator variants over ten large
    pages, one A4 page's peak split, and OCR_DET_MAX_SIDE's trade."""
    variants = [[v["variant"]] + [f"{v[k]:,.0f}" for k in ("after_load_mib", "steady_end_mib",
                                                          "peak_max_mib")] + [v.get("cpu_s", "")]
                for v in result["variants"]]
    split = result["peak_split"]
    parts = [["the decoded page (BGR)", round(split["decoded_page_mib"])],
             ["pre-processing, held during detection (numpy, tracemalloc)",
              round(split["numpy_before_det_mib"])],
             [f"the detector's activations, arena off (on: "
              f"{split['det_run_peak_over_input_mib_arena_on']:,.0f}, and "
              f"{split['det_run_retained_mib_arena_on']:,.0f} kept)",
              round(split["det_run_peak_over_input_mib_arena_off"])],
             ["the pipeline's numpy peak overall", round(split["numpy_peak_mib"])]]
    pages = list(dict.fromkeys(row["page"] for row in result["det_cap_trade"]))
    caps = list(dict.fromkeys(row["cap"] for row in result["det_cap_trade"]))
    cell = {(r["cap"], r["page"]): f"+{r['peak_over_idle_mib']:,.0f} MiB, "
            f"{r['word_recall'] * 100:.1f} %" for r in result["det_cap_trade"]}
    trade = [[cap] + [cell[(cap, page)] for page in pages] for cap in caps]
    engines = report.engine_label([v["engine"] for v in result["variants"]]
                                  + [r["engine"] for r in result["det_cap_trade"]])
    return "\n".join([
        _markdown(["setting", "after load", "steady after 10 pages", "peak",
                   "CPU s (10 pages)"], variants),
        f"\nOne page's peak ({split['page']}; the detector sees it at "
        f"{' x '.join(str(n) for n in split['input_shape'][2:][::-1])}), MiB:\n",
        _markdown(["part", "MiB"], parts),
        "\n`OCR_DET_MAX_SIDE`: the peak over idle and the share of the words found:\n",
        _markdown(["`OCR_DET_MAX_SIDE`", *pages], trade),
        f"\nEngine: {engines}. {measured(result)}."])


def bench_table(summary: dict[str, Any]) -> str:
    """One `make bench` run (bench_all's summary.json): every part's rows, and the engine its
    workers reported."""
    rows = [[name, *row] for name, part in summary["parts"].items() if "rows" in part
            for row in part["rows"]]
    broken = [name for name, part in summary["parts"].items() if "error" in part]
    by_engine: dict[str, list[str]] = {}
    for name, part in summary["parts"].items():
        if part.get("engines"):
            by_engine.setdefault(report.engine_label(part["engines"]), []).append(name)
    engines = "; ".join(f"{label} ({', '.join(names)})" for label, names in by_engine.items())
    return "\n".join([
        _markdown(["part", *report.HEADERS], rows),
        f"\nEngines, as the workers reported them: {engines}."
        + (f" Parts that failed to run: {', '.join(broken)}." if broken else "")
        + f" {measured(summary)} ({summary['seconds'] / 60:.0f} min)."])


def _markdown(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[report._fmt(v) for v in row] for row in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    out += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(out)


# (document, table name, result file, renderer)
TABLES: list[tuple[str, str, str, Callable[[dict[str, Any]], str]]] = [
    ("docs/capacity.md", "fleet-table", "fleet.json", fleet_table),
    ("docs/capacity.md", "fleet-before", "fleet-before.json", fleet_table),
    ("docs/capacity.md", "fleet-images-sent-at-once", "fleet-images-sent-at-once.json",
     fleet_table),
    ("docs/capacity.md", "fleet-list-1-process", "fleet-list-1-process.json", fleet_table),
    ("docs/capacity.md", "fleet-list-2-processes", "fleet-list-2-processes.json", fleet_table),
    ("docs/capacity.md", "gateway-memory", "gateway-memory.json", gateway_memory_table),
    ("docs/capacity.md", "gateway-memory-before", "gateway-memory-before.json",
     gateway_memory_table),
    ("docs/benchmarks.md", "scan-pdf", "scan-pdf-accuracy.json", scan_pdf_table),
    ("docs/cache.md", "cache", "cache.json", cache_table),
    ("docs/benchmarks.md", "scaling", "scaling.json", scaling_table),
    ("docs/benchmarks.md", "paddlex", "paddlex.json", paddlex_table),
    ("docs/benchmarks.md", "bench", "bench/summary.json", bench_table),
    ("docs/benchmarks.md", "accuracy", "accuracy.json", accuracy_table),
    ("docs/operations.md", "memory-soak", "bench/memory.json", memory_table),
    ("docs/operations.md", "memory-sources", "memory_sources.json", memory_sources_table),
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
