"""The `ocrfleet` command (installed by `make install`):

    ocrfleet ocr FILE [--format json|txt|pdf|alto|hocr|md] [-o OUT]
    ocrfleet batch INPUT_DIR OUTPUT_DIR [--glob PATTERN] [--format json,txt,pdf,alto,hocr|md]
                   [--concurrency N]

--url (env OCRFLEET_URL, default http://127.0.0.1:8080) is the gateway; --api-key (env
OCRFLEET_API_KEY) is sent as `Authorization: Bearer KEY`. Exit status: 0 when everything
was OCR'd, 1 when a document (or any file of a batch) failed, 2 for a usage error, 130 when
interrupted."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import batch
from .client import FORMATS, LAYOUT, Client, OcrFailed, Settings

DEFAULT_URL = "http://127.0.0.1:8080"


def _formats(text: str) -> list[str]:
    formats = list(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    unknown = [f for f in formats if f not in FORMATS]
    if not formats or unknown:
        raise argparse.ArgumentTypeError(f"formats are {', '.join(FORMATS)} (comma-separated)")
    if LAYOUT in formats and len(formats) > 1:
        raise argparse.ArgumentTypeError(f"{LAYOUT} (layout parsing's Markdown) comes alone: "
                                         "it is not one OCR pass with the others")
    return formats


def _single_format(text: str) -> list[str]:
    formats = _formats(text)
    if len(formats) != 1:
        raise argparse.ArgumentTypeError(f"one format: {', '.join(FORMATS)}")
    return formats


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("OCRFLEET_URL") or DEFAULT_URL,
                        help="the gateway (env OCRFLEET_URL; default %(default)s)")
    common.add_argument("--api-key", default=os.environ.get("OCRFLEET_API_KEY"),
                        help="sent as 'Authorization: Bearer KEY' (env OCRFLEET_API_KEY)")
    common.add_argument("--timeout", type=float, default=900.0,
                        help="seconds to wait for one document's answer (default 900)")
    common.add_argument("--retries", type=int, default=5,
                        help="retries of network errors and 502/504 per document (default 5)")
    common.add_argument("--max-wait", type=float, default=600.0,
                        help="seconds a document may wait on 429/503 Retry-After (default 600)")
    common.add_argument("--visualize", action="store_true",
                        help="ask for visualization images in JSON output (off by default)")
    top = argparse.ArgumentParser(prog="ocrfleet", description="Client for an ocrfleet gateway")
    commands = top.add_subparsers(dest="command", required=True)
    one = commands.add_parser("ocr", parents=[common], help="OCR one document")
    one.add_argument("file", type=Path)
    one.add_argument("--format", type=_single_format, default=["json"],
                     help="json (default), txt, pdf (searchable PDF), alto (ALTO v4 XML), "
                     "hocr or md (Markdown, from POST /layout-parsing)")
    one.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    many = commands.add_parser("batch", parents=[common], help="OCR every file of a folder")
    many.add_argument("input_dir", type=Path)
    many.add_argument("output_dir", type=Path)
    many.add_argument("--glob", dest="pattern", help="files to take, relative to INPUT_DIR "
                      "(default: every PDF, PNG, JPEG, BMP, TIFF and WebP, recursively)")
    many.add_argument("--format", type=_formats, default=["json"],
                      help="comma-separated: json, txt, pdf, alto, hocr (default json); "
                      "or md alone (Markdown, from POST /layout-parsing)")
    many.add_argument("--concurrency", type=int, default=4,
                      help="documents in flight at once (default 4)")
    many.add_argument("--no-progress", action="store_true", help="no progress bar")
    return top


def _settings(args) -> Settings:
    return Settings(url=args.url, api_key=args.api_key, timeout_s=args.timeout,
                    retries=args.retries, max_wait_s=args.max_wait, visualize=args.visualize)


def _ocr_one(args) -> int:
    if not args.file.is_file():
        print(f"ocrfleet: {args.file}: no such file", file=sys.stderr)
        return 2
    try:
        answer = Client(_settings(args)).ocr(args.file, args.format)
    except OcrFailed as exc:
        print(f"ocrfleet: {args.file}: {exc.reason}", file=sys.stderr)
        return 1
    data = answer.outputs[args.format[0]]
    if args.output:
        batch.write_atomically(args.output, data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return 0


def _batch(args) -> int:
    if not args.input_dir.is_dir():
        print(f"ocrfleet: {args.input_dir}: not a folder", file=sys.stderr)
        return 2
    if args.output_dir.resolve() == args.input_dir.resolve():
        print("ocrfleet: OUTPUT_DIR must not be INPUT_DIR", file=sys.stderr)
        return 2
    options = batch.BatchOptions(args.input_dir, args.output_dir, args.format, args.pattern,
                                 args.concurrency, False if args.no_progress else None)
    try:
        return batch.run(Client(_settings(args)), options)
    except batch.OutputCollision as exc:
        print(f"ocrfleet: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _ocr_one(args) if args.command == "ocr" else _batch(args)
    except KeyboardInterrupt:
        print("ocrfleet: interrupted; finished files are kept, run again to continue",
              file=sys.stderr)
        sys.stderr.flush()
        os._exit(130)  # threads still waiting on the gateway must not hold the exit


if __name__ == "__main__":
    sys.exit(main())
