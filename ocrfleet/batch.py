"""`ocrfleet batch`: every matching file under INPUT_DIR through the gateway, its outputs
mirrored under OUTPUT_DIR (`a/b/scan.png` -> `a/b/scan.txt`, `scan.alto.xml`, `scan.hocr`;
two inputs of one folder that share a stem keep their suffix: `scan.png.txt`).

Resumable: a file whose every output exists is skipped, and an output only exists once
complete, because each is written to a temporary file in its folder and renamed into place
(os.replace). Temporary files a killed run left behind are removed at the start. At the end:
a summary, and OUTPUT_DIR/ocrfleet-report.json with the counts and every failed file with
its reason."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from .client import Client, OcrFailed

SUPPORTED = {".pdf", ".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp"}
REPORT_NAME = "ocrfleet-report.json"
TEMP_MARK = ".ocrfleet-"
TEMP_SUFFIX = ".part"
EXTENSIONS = {"alto": "alto.xml"}  # an output's file extension, when not the format's name


def write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path`, or (after a crash) nothing there: a temporary sibling, fsynced,
    then renamed over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
                          f"{TEMP_SUFFIX}")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def remove_stale_temp_files(output_dir: Path) -> int:
    removed = 0
    for path in output_dir.rglob(f".*{TEMP_MARK}*{TEMP_SUFFIX}"):
        if path.is_file():
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def discover(input_dir: Path, pattern: str | None, output_dir: Path) -> list[Path]:
    """Matching files (relative to input_dir), sorted; hidden files and anything under
    output_dir left out. Without a pattern: every file with a suffix the fleet reads."""
    output_dir = output_dir.resolve()
    found = []
    for path in input_dir.glob(pattern or "**/*"):
        relative = path.relative_to(input_dir)
        if not path.is_file() or any(part.startswith(".") for part in relative.parts):
            continue
        if path.resolve().is_relative_to(output_dir):
            continue
        if pattern is None and path.suffix.lower() not in SUPPORTED:
            continue
        found.append(relative)
    return sorted(found)


class OutputCollision(ValueError):
    """Two inputs would write the same output file (x.pdf next to x.png and x.pdf.png)."""


def output_names(files: list[Path], formats: list[str]) -> dict[Path, dict[str, Path]]:
    """Each input's output path (relative) per format; OutputCollision, naming both inputs,
    when two of them would write the same file (never one over the other)."""
    stems = Counter((f.parent, f.stem) for f in files)
    names: dict[Path, dict[str, Path]] = {}
    writers: dict[Path, Path] = {}
    for f in files:
        base = f.stem if stems[(f.parent, f.stem)] == 1 else f.name
        names[f] = {fmt: f.parent / f"{base}.{EXTENSIONS.get(fmt, fmt)}" for fmt in formats}
        for path in names[f].values():
            other = writers.setdefault(path, f)
            if other != f:
                raise OutputCollision(f"{other} and {f} would both write {path}: rename one "
                                      "of them (or run them in separate batches)")
    return names


@dataclass
class Tally:
    done: int = 0
    skipped: int = 0
    pages: int = 0
    cached: int | None = None  # pages answered from the gateway's page cache (None: it is off)
    retried: int = 0
    failed: list[dict] = field(default_factory=list)


@dataclass
class BatchOptions:
    input_dir: Path
    output_dir: Path
    formats: list[str]
    pattern: str | None = None
    concurrency: int = 4
    progress: bool | None = None  # None: only on a terminal


def _one(client: Client, options: BatchOptions, relative: Path,
         outputs: dict[str, Path]) -> tuple[int, int, int | None]:
    answer = client.ocr(options.input_dir / relative, options.formats)
    for fmt, path in outputs.items():
        write_atomically(options.output_dir / path, answer.outputs[fmt])
    return answer.pages, answer.attempts, answer.cached


def _record(future, relative: Path, tally: Tally) -> None:
    try:
        pages, attempts, cached = future.result()
        tally.done += 1
        tally.pages += pages
        if cached is not None:
            tally.cached = (tally.cached or 0) + cached
        tally.retried += attempts > 1
    except OcrFailed as exc:
        tally.failed.append({"file": str(relative), "status": exc.status,
                             "attempts": exc.attempts, "reason": exc.reason})
    except OSError as exc:
        tally.failed.append({"file": str(relative), "status": None, "attempts": 1,
                             "reason": f"I/O error: {exc}"})
    except Exception as exc:  # one odd file must not stop the batch
        tally.failed.append({"file": str(relative), "status": None, "attempts": 1,
                             "reason": f"{type(exc).__name__}: {exc}"})


def _report(options: BatchOptions, client: Client, tally: Tally, total: int,
            seconds: float) -> dict:
    return {"url": client.settings.url, "input_dir": str(options.input_dir),
            "output_dir": str(options.output_dir), "formats": options.formats,
            "files": total, "done": tally.done, "skipped_already_done": tally.skipped,
            "failed": len(tally.failed), "retried": tally.retried, "pages": tally.pages,
            "cached_pages": tally.cached, "seconds": round(seconds, 2),
            "pages_per_s": round(tally.pages / seconds, 3) if seconds > 0 else None,
            "failures": sorted(tally.failed, key=lambda f: f["file"])}


def cached_share(tally: Tally) -> dict[str, str]:
    """The progress bar's `cached=N (P%)`: pages the gateway answered from its page cache,
    once it has said so for any (nothing while its cache is off)."""
    if tally.cached is None:
        return {}
    share = tally.cached / tally.pages if tally.pages else 0.0
    return {"cached": f"{tally.cached} ({share:.0%})"}


def run(client: Client, options: BatchOptions, out=sys.stdout) -> int:
    """Process the folder; the exit status: 0 when no file failed, else 1."""
    options.output_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(options.output_dir)
    files = discover(options.input_dir, options.pattern, options.output_dir)
    names = output_names(files, options.formats)
    tally = Tally()
    todo = []
    for relative in files:
        if all((options.output_dir / p).is_file() for p in names[relative].values()):
            tally.skipped += 1
        else:
            todo.append(relative)
    report_path = options.output_dir / REPORT_NAME
    for relative in [r for r in todo if report_path in
                     {options.output_dir / p for p in names[r].values()}]:
        todo.remove(relative)
        tally.failed.append({"file": str(relative), "status": None, "attempts": 0,
                             "reason": f"its output would overwrite {REPORT_NAME}"})
    started = time.monotonic()
    bar = tqdm(total=len(todo), unit="file", desc="ocrfleet", dynamic_ncols=True,
               disable=None if options.progress is None else not options.progress)
    pool = ThreadPoolExecutor(max(1, options.concurrency), thread_name_prefix="ocr")
    try:
        futures = {pool.submit(_one, client, options, r, names[r]): r for r in todo}
        for future in as_completed(futures):
            _record(future, futures[future], tally)
            elapsed = max(time.monotonic() - started, 1e-9)
            bar.set_postfix(pages=tally.pages, **cached_share(tally),
                            pages_per_s=f"{tally.pages / elapsed:.2f}",
                            failed=len(tally.failed), refresh=False)
            bar.update(1)
    finally:
        # on Ctrl-C, files in flight are abandoned (their temporary files go next run)
        pool.shutdown(wait=False, cancel_futures=True)
    bar.close()
    seconds = time.monotonic() - started
    report = _report(options, client, tally, len(files), seconds)
    write_atomically(report_path, json.dumps(report, indent=2, ensure_ascii=False).encode())
    print(f"{len(files)} file(s): {tally.done} done ({tally.pages} pages in {seconds:.1f} s"
          f"{f', {tally.pages / seconds:.2f} pages/s' if seconds > 0 and tally.pages else ''}"
          f"{f', {tally.cached} of them from the cache' if tally.cached else ''}"
          f"), {tally.skipped} already done, {len(tally.failed)} failed"
          + (f" (see {report_path})" if tally.failed else ""), file=out)
    for failure in report["failures"][:20]:
        print(f"  failed: {failure['file']}: {failure['reason']}", file=out)
    return 1 if tally.failed else 0
