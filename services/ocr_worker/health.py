"""Liveness of the worker: is the inference thread still making progress?

A thread that is alive but stuck (a wedged GPU call, a deadlock in a native library) answers
no pages, while the HTTP threads keep answering probes: admission fills up and every request
gets 503, yet a plain "the process answers" liveness check stays green for ever. Here the
worker counts as stuck when pages are waiting (in the engine or in the queue) and none has
gone into or come out of the engine for `stall_timeout_s` per page of the engine call under
way. Then /healthz (liveness) and /readyz answer 503, and Kubernetes restarts the container.

Pure: takes the batcher's Progress snapshot, returns why it is stuck or None."""

from __future__ import annotations

from .batcher import Progress


def stall_reason(progress: Progress, stall_timeout_s: float) -> str | None:
    """Why the inference thread is considered stuck, or None while it is fine."""
    if not progress.loaded or progress.stopping:
        return None  # loading is the startup probe's business; stopping is meant to end
    if not progress.running:
        return "the inference thread has exited"
    waiting = progress.in_engine + progress.queued
    if progress.idle or waiting == 0:
        return None
    limit = stall_timeout_s * max(1, progress.in_engine)
    if progress.since_progress_s <= limit:
        return None
    return (f"the inference thread made no progress for {progress.since_progress_s:.0f} s "
            f"(limit {limit:g} s) with {waiting} page(s) waiting")
