"""`make screenshots`: the web page at desktop and phone width, after reading a 3-page PDF on a
real fleet (two workers and the gateway on loopback), as PNGs in bench/results/ui/: the whole
page (desktop.png, phone.png) and the desktop's first screenful in few colours
(desktop-small.png, the copy kept as docs/web-page.png)."""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

from samples import documents
from scripts.browser import chromium, chromium_missing
from scripts.fleet import REPO_ROOT, free_port, gateway_process, stop_all, worker_process

VIEWPORTS = {"desktop": {"width": 1440, "height": 900}, "phone": {"width": 390, "height": 844}}


def start_fleet(log_dir: Path, workers: int = 2, worker_env: dict[str, str] | None = None):
    """`workers` real workers and a gateway (one process) over them, all on loopback:
    (processes, gateway URL). The caller stops them with scripts.fleet.stop_all."""
    processes, urls = [], []
    try:
        for _ in range(workers):
            port = free_port()
            processes.append(worker_process(port, {"OCR_THREADS": "1", **(worker_env or {})},
                                            log_dir / f"worker-{port}.log").start())
            urls.append(f"http://127.0.0.1:{port}")
        for process in processes:
            process.wait_ready(180)
        port = free_port()
        gateway = gateway_process(port, {"GATEWAY_REPLICAS": ",".join(urls),
                                         "GATEWAY_PROCESSES": "1"}, log_dir / "gateway.log")
        processes.append(gateway.start())
        gateway.wait_ready(60)
        return processes, f"http://127.0.0.1:{port}"
    except BaseException:
        stop_all(processes)
        raise


def read_document(page, base_url: str, path: Path) -> None:
    """Open the page, upload `path`, wait until the summary line has arrived."""
    page.goto(base_url + "/")
    page.wait_for_selector("#fleet-table tbody tr")
    page.set_input_files("#file", str(path))
    page.click("#submit")
    page.wait_for_selector("#progress-text:has-text('finished')", timeout=300_000)


def write_small(png: bytes, target: Path) -> None:
    """The first screenful, in 64 colours: small enough to keep in the repository (docs/)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        image.convert("RGB").quantize(64).save(target, optimize=True)
    print(f"wrote {target.relative_to(REPO_ROOT)} ({target.stat().st_size // 1024} KB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "ui")
    args = parser.parse_args(argv)
    why = chromium_missing()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        pdf = tmp_path / "letter.pdf"
        pdf.write_bytes(documents.labelled_pdf(3, lines_per_page=6))
        processes, base_url = start_fleet(tmp_path)
        try:
            with chromium() as browser:
                for name, viewport in VIEWPORTS.items():
                    context = browser.new_context(viewport=viewport)
                    page = context.new_page()
                    read_document(page, base_url, pdf)
                    polls = int(page.get_attribute("#fleet-summary", "data-polls") or 0)
                    page.wait_for_selector(f'#fleet-summary[data-polls="{polls + 1}"]')
                    page.hover("#page-1 .lines li >> nth=1")
                    target = args.out / f"{name}.png"
                    page.screenshot(path=str(target), full_page=True)
                    print(f"wrote {target.relative_to(REPO_ROOT)}")
                    if name == "desktop":
                        write_small(page.screenshot(), args.out / "desktop-small.png")
                    context.close()
        finally:
            stop_all(processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
