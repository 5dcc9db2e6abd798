"""Shares that remember: a document's weight in the fleet, so that one that got ahead gives
the lead back.

Equal documents submitted together should finish together, whichever gateway process they
came through. Shares are equal at every moment (gateway.flow.share), but the first moments are
not: a process that admits its documents before it has heard the others' demand sends up to
the share its board shows, and its documents start a whole page time ahead. With equal
shares from then on, the lead is never given back, and they finish first.

So the rate each document was sent at is measured: its chunks sent over its age plus one
page time, which is exactly its share's rate from the start (the first page time's worth goes
out at once). Each process tells the board its documents' mean rate (`s` entries); the
fleet's rate is the mean over every process. A document's lead is what it was sent beyond the
fleet's rate over its own age, in quotas (its chunks in flight). The weight follows the mean
lead of the last page time beyond DEAD_BAND (a quota ahead, three quarters of a share; a
quota and a half, half; never under one STEP; the rounding to a STEP leaves up to three quarters
of a quota alone). The mean over a page time, because pages come back in waves: a
document's lead jumps a quota at each refill and falls back over the page time, and a
process hears the others' rates a second late, so right after a wave every process sees its
documents ahead. Taken at once, every process would slow its documents together, each
taking its own fall at once and the others' room only as it heard of it, and the processes'
fractions would add up to well under the fleet. Nor the least of the page time: that is the lead just
before a refill, half a quota under the mean, and a document a quota ahead kept its share.
A lead that lasts is real. The usual one: the first document of a process comes alone and
sends that process's whole first part while its siblings are still being split, and it
would finish about a page time ahead.
The documents behind are not raised in the fleet: the share a slowed document leaves goes to
the others by the board's arithmetic, and raising them as well would over-fill the fleet
while the board catches up (their images then wait behind pages). Within a process, though,
share moves from the documents ahead of its own rate to those behind (`moves`): its demand
on the fleet stays the same, so no other process need hear of it first. Rates, not counts,
are compared, so a document that came later keeps its equal share: it is not owed what the
others got before it came. A weight goes down one STEP at a time, at most every HOLD_S, so
that the board (and the shares computed from it) can follow; back up as soon as the mean
lead calls for it. Pure: the caller gives the clock's time."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

STEP = 0.25  # a weight moves by this much, and is never under it
HOLD_S = 0.5
SLOPE = 0.5  # the weight's change per quota of lead
DEAD_BAND = 0.5  # quotas of lead left alone
SIBLING_BAND = 0.25  # quotas of lead on the process's own documents left alone
MOST_MOVED = 0.5  # of a share, to or from one document within its process


def rate(sent: int, age_s: float, page_s: float) -> float:
    """Chunks sent per second since the document came, counting its first page time."""
    return sent / (max(0.0, age_s) + page_s)


@dataclass
class Weight:
    value: float = 1.0
    changed_at: float = float("-inf")
    _leads: deque = field(default_factory=deque)  # (when, lead in quotas, integral to then)

    def follow(self, lead: float, quota: float, now: float, window_s: float = 0.0) -> float:
        """The weight the mean lead of the last `window_s` (`lead` chunks over a `quota` now,
        and those said before) calls for: at once when higher, else one STEP down towards
        it. Leads within DEAD_BAND quotas are left alone."""
        self._say(lead / max(quota, 1.0), now, window_s)
        goal = 1.0 - SLOPE * max(0.0, self.mean(now, window_s) - DEAD_BAND)
        goal = min(1.0, max(STEP, round(goal / STEP) * STEP))
        if goal > self.value:
            self.value = goal  # the lead shrinks: no holding back what is not owed
        elif goal < self.value and now - self.changed_at >= HOLD_S:
            self.value -= STEP
            self.changed_at = now
        return self.value

    def mean(self, now: float, window_s: float) -> float:
        """The mean lead (quotas) of the last `window_s`, each lead held until the next was
        said, or of as much as was said when less (the last one, at its first moment):
        counting no lead before the first, a document that got ahead in the first page
        time kept its whole share through the first refill."""
        when, quotas, integral = self._leads[0]
        start = max(when, now - window_s)
        if now <= start:
            return self._leads[-1][1]
        return (self._leads[-1][2] - integral - quotas * (start - when)) / (now - start)

    def _say(self, quotas: float, now: float, window_s: float) -> None:
        if self._leads:
            when, last, integral = self._leads[-1]
            self._leads.append((now, quotas, integral + last * (now - when)))
        else:
            self._leads.append((now, quotas, 0.0))
        while len(self._leads) > 1 and self._leads[1][0] <= now - window_s:
            self._leads.popleft()


def moves(leads: list[float], quota: float) -> list[float]:
    """Share moved between the documents of one process, each by its lead (chunks) on the
    process's own documents' rate: from those ahead to those behind, summing to nothing (the
    process's demand on the fleet stays as it is, so no other process need hear of it
    first). They see the fleet through the same board and are refilled in the same waves,
    so a lead on each other is no stale news: beyond SIBLING_BAND quotas it is real, the
    one above all that the first document of a process takes when it sends the process's
    whole first part while the others are still being split."""
    raw = [0.0 if abs(x) <= SIBLING_BAND * max(quota, 1.0) else
           max(-MOST_MOVED, min(MOST_MOVED, -SLOPE * x / max(quota, 1.0))) for x in leads]
    mean = sum(raw) / len(raw) if raw else 0.0
    return [r - mean for r in raw]


def fleet_rate(rates: list, demands: dict[str, float], mine: float | None,
               own_id: str) -> float | None:
    """The mean rate the fleet's documents with pages to send were sent at: each process's
    (its `s` entries on the board), by its demand; None while no process with documents has
    said one. `mine`: this process's, None when it has no documents with pages to send."""
    said = {e.id: e.value for e in rates if e.id != own_id}
    if mine is not None:
        said[own_id] = mine
    weights = {i: demands[i] for i in said if demands.get(i)}
    total = sum(weights.values())
    return sum(said[i] * w for i, w in weights.items()) / total if total else None
