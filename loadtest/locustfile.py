"""Locust users against the gateway (or any /ocr endpoint): single images, short PDFs (2-4 pages)
and long PDFs (16-32 pages) in a 6:3:1 mix with think time, and the flow-control mix
(MixedLoadUser: 40-page PDFs with images in between). Every answer is checked (checks.py): a
wrong one is a failure. `make loadtest` runs it headless; loadtest/README.md has the knobs."""

from __future__ import annotations

import functools
import os
import random

import gevent
from locust import HttpUser, between, events, task

from loadtest.checks import answer_problem
from loadtest.payloads import (JSON_HEADERS, Payload, dense_page_payloads, labelled_pdf_payload,
                               small_image_payloads)

TIMEOUT_S = float(os.environ.get("LOCUST_TIMEOUT_S", "300"))
LONG_PAGES = [int(n) for n in os.environ.get("LOCUST_LONG_PAGES", "16,32").split(",")]
MIXED_PAGES = int(os.environ.get("LOCUST_MIXED_PAGES", "40"))
_VISUALIZE_CHOICES = {"0": False, "1": True, "": None}  # None: the server's default (draw)
if os.environ.get("LOCUST_VISUALIZE", "0") not in _VISUALIZE_CHOICES:
    raise SystemExit("LOCUST_VISUALIZE must be 0, 1 or empty")
VISUALIZE = _VISUALIZE_CHOICES[os.environ.get("LOCUST_VISUALIZE", "0")]


@functools.cache
def documents() -> dict[str, list[Payload]]:
    """What the users send, generated once per process."""
    v = VISUALIZE
    return {"images": small_image_payloads(6, visualize=v) + dense_page_payloads(1, visualize=v),
            "short": [labelled_pdf_payload(2, seed=1, visualize=v),
                      labelled_pdf_payload(3, seed=2, visualize=v),
                      labelled_pdf_payload(4, seed=3, visualize=v, table=True)],
            "long": [labelled_pdf_payload(n, seed=10 + n, visualize=v) for n in LONG_PAGES],
            "mixed": [labelled_pdf_payload(MIXED_PAGES, seed=40, visualize=v)]}


@events.init.add_listener
def _generate_documents(environment, **_kwargs):
    documents()  # before any user starts, so generating them never shows up as latency
    gevent.sleep(0)  # let gevent's clock catch up, or --run-time would count the generation


def send_checked(user: HttpUser, kind: str, label: str | None = None) -> None:
    """POST one document of this kind; the request fails unless its answer is right."""
    payload = random.choice(documents()[kind])
    with user.client.post("/ocr", data=payload.body, headers=JSON_HEADERS, timeout=TIMEOUT_S,
                          name=label or f"/ocr pdf {payload.expected.pages}p",
                          catch_response=True) as response:
        problem = answer_problem(response.status_code, response.json, payload.expected)
        if problem:
            response.failure(problem)
        else:
            response.success()


class ImageUser(HttpUser):
    """Someone OCRing photos and screenshots, one at a time."""

    weight, wait_time = 6, between(1, 3)

    @task
    def one_image(self):
        send_checked(self, "images", "/ocr image")


class ShortPdfUser(HttpUser):
    """Invoices and letters: 2-4 page PDFs."""

    weight, wait_time = 3, between(2, 5)

    @task
    def short_pdf(self):
        send_checked(self, "short", "/ocr pdf 2-4p")


class LongPdfUser(HttpUser):
    """Reports and contracts: long PDFs the gateway splits across replicas."""

    weight, wait_time = 1, between(5, 15)

    @task
    def long_pdf(self):
        send_checked(self, "long")


class MixedLoadUser(HttpUser):
    """The flow-control mix: a long PDF now and then, single images in between, short pauses;
    with enough of these the gateway queues the long documents while images overtake."""

    weight, wait_time = 1, between(0.2, 0.5)

    @task(1)
    def long_pdf(self):
        send_checked(self, "mixed", f"/ocr mixed pdf {MIXED_PAGES}p")

    @task(8)
    def image(self):
        send_checked(self, "images", "/ocr mixed image")
