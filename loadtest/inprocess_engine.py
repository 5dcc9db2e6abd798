"""The in-process side of the serving-overhead benchmark: the worker's own engine
(services/ocr_worker/engine.py, same configuration, same thread count) called directly on the
same images the HTTP side sends, one page at a time, in a fresh process so thread settings apply
before any numeric library loads. Prints one JSON line: pages, seconds, pages_per_s.

Run: python -m loadtest.inprocess_engine --threads 1 --pages 8 [--engine sim]"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--images", type=int, default=2, help="distinct dense pages to cycle")
    parser.add_argument("--engine", default="paddleocr", choices=("paddleocr", "sim"))
    args = parser.parse_args(argv)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(args.threads)

    import base64

    import cv2
    import numpy as np

    from loadtest.payloads import dense_page_payloads
    from services.ocr_worker.config import WorkerConfig
    from services.ocr_worker.engine import create_engine

    # the exact bytes the HTTP side sends, decoded the way the worker decodes images
    images = [cv2.imdecode(np.frombuffer(base64.b64decode(json.loads(p.body)["file"]), np.uint8),
                           cv2.IMREAD_COLOR) for p in dense_page_payloads(args.images)]

    config = WorkerConfig.from_env({**os.environ, "OCR_ENGINE": args.engine,
                                    "OCR_THREADS": str(args.threads)})
    engine = create_engine(config)
    engine.load()
    engine.predict([images[0]], {})[0].result_json()  # warm-up, not timed
    started = time.perf_counter()
    for index in range(args.pages):
        engine.predict([images[index % len(images)]], {})[0].result_json()
    seconds = time.perf_counter() - started
    print(json.dumps({"pages": args.pages, "seconds": seconds,
                      "pages_per_s": args.pages / seconds, "threads": args.threads,
                      "engine": engine.info}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
