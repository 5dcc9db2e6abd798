"""Locust scenarios against the gateway (or any /ocr endpoint): users who send single images,
short PDFs (2-4 pages) and long PDFs (16-32 pages) in a 6:3:1 mix with think time, and the
flow-control mix (MixedLoadUser: 40-page PDFs with images in between). Every answer is checked
(checks.py): a wrong one is a failure. `make loadtest` (run_locust.py) runs it headless;
loadtest/README.md has the knobs (LOCUST_*) and the interactive command."""

from __future__ import annotations

import os
import random

import gevent
from locust import HttpUser, between, events, task

from loadtest.checks import answer_problem
from loadtest.payloads import JSON_HEADERS, Payload, locust_mix

TIMEOUT_S = float(os.environ.get("LOCUST_TIMEOUT_S", "300"))
LONG_PAGES = tuple(int(n) for n in os.environ.get("LOCUST_LONG_PAGES", "16,32").split(","))
MIXED_PAGES = int(os.environ.get("LOCUST_MIXED_PAGES", "40"))
_VISUALIZE_CHOICES = {"0": False, "1": True, "": None}
if os.environ.get("LOCUST_VISUALIZE", "0") not in _VISUALIZE_CHOICES:
    raise SystemExit("LOCUST_VISUALIZE must be 0, 1 or empty")
VISUALIZE = _VISUALIZE_CHOICES[os.environ.get("LOCUST_VISUALIZE", "0")]


def documents():
    return locust_mix(LONG_PAGES, VISUALIZE, MIXED_PAGES)


@events.init.add_listener
def _generate_documents(environment, **_kwargs):
    documents()  # once, before any user starts, so generation never shows up as latency
    # gevent's clock only moves when its loop runs: without this, --run-time (started next)
    # would count from before the generation, and on a busy machine end before any request
    gevent.sleep(0)


def send_checked(user: HttpUser, payload: Payload, label: str) -> None:
    """POST one payload; mark the request failed unless its answer is right."""
    with user.client.post("/ocr", data=payload.body, headers=JSON_HEADERS, name=label,
                          timeout=TIMEOUT_S, catch_response=True) as response:
        problem = answer_problem(response.status_code, response.json, payload.expected)
        if problem:
            response.failure(problem)
        else:
            response.success()


class ImageUser(HttpUser):
    """Someone OCRing photos and screenshots, one at a time."""

    weight = 6
    wait_time = between(1, 3)

    @task
    def one_image(self):
        send_checked(self, random.choice(documents().images), "/ocr image")


class ShortPdfUser(HttpUser):
    """Invoices and letters: 2-4 page PDFs."""

    weight = 3
    wait_time = between(2, 5)

    @task
    def short_pdf(self):
        send_checked(self, random.choice(documents().short_pdfs), "/ocr pdf 2-4p")


class MixedLoadUser(HttpUser):
    """The flow-control mix (issue: several long PDFs at once plus small requests): a 40-page
    PDF now and then, single images in between, no think time beyond a short pause. With
    enough of these the gateway's queue holds the long documents while images overtake."""

    weight = 1
    wait_time = between(0.2, 0.5)

    @task(1)
    def long_pdf(self):
        send_checked(self, documents().mixed_long_pdf, f"/ocr mixed pdf {MIXED_PAGES}p")

    @task(8)
    def image(self):
        send_checked(self, random.choice(documents().images), "/ocr mixed image")


class LongPdfUser(HttpUser):
    """Reports and contracts: long PDFs split across replicas by the gateway."""

    weight = 1
    wait_time = between(5, 15)

    @task
    def long_pdf(self):
        payload = random.choice(documents().long_pdfs)
        send_checked(self, payload, f"/ocr pdf {payload.expected.pages}p")
