"""Shares that remember: a document's weight in the fleet, so that one that got ahead gives
the lead back.

Equal documents submitted together should finish together, whichever gateway process they
came through. Shares are equal at every moment (gateway.fleet), but the first moments are
not: a process that admits its documents before it has heard the others' demand sends up to
the share its board shows, and its documents start a whole page time ahead. With equal
shares from then on, the lead is never given back, and they finish first.

So the rate each document was sent at is measured: its chunks sent over its age plus one
page time, which is exactly its share's rate from the start (the first page time's worth goes
out at once). Each process tells the board its documents' mean rate (`s` entries); the
fleet's rate is the mean over every process. A document's lead is what it was sent beyond the
fleet's rate over its own age, in quotas (its chunks in flight). The weight follows the least
lead of the last page time beyond DEAD_BAND (a quota ahead, three quarters of a share; a
quota and a half, half; never under MIN; the rounding to a STEP leaves up to three quarters
of a quota alone). The least, because pages come back in waves: a document's lead jumps a
quota at each refill and shrinks back over the page time, and a process hears the others'
rates a second late, so right after a wave every process sees its documents ahead. Taken at
once, every process slowed its documents together, each taking its own fall at once and the
others' room only as it heard of it: at 64 replicas of 2 s pages with 4 gateways the
processes' fractions added up to well under the fleet, and many workers idled after the
first waves. A lead that lasts a page time is no wave. The usual one: the first document of
a process comes alone and sends that process's whole first part while its siblings are
still being split; with a whole quota left alone it finished about a page time ahead (at
128 replicas of 4 s pages, a tenth of the makespan). The documents behind are not raised:
the share a slowed document leaves goes to the others by the board's arithmetic, and raising
them as well would over-fill the fleet while the board catches up (their images then wait
behind pages). Rates, not counts, are compared, so a document that came later keeps its
equal share: it is not owed what the others got before it came. A weight goes down one STEP
at a time, at most every HOLD_S, so that the board (and the shares computed from it) can
follow; back up at once as the lead shrinks, so a document that gave its lead back does not
fall behind. Pure: the caller gives the clock's time."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MIN, STEP = 0.25, 0.25
HOLD_S = 0.5
SLOPE = 0.5  # the weight's change per quota of lead
DEAD_BAND = 0.5  # quotas of lead left alone


def rate(sent: int, age_s: float, page_s: float) -> float:
    """Chunks sent per second since the document came, counting its first page time."""
    return sent / (max(0.0, age_s) + page_s)


@dataclass
class Weight:
    value: float = 1.0
    changed_at: float = float("-inf")
    _leads: deque = field(default_factory=deque)  # (when, lead in quotas), rising: the
    # last window's least first, and only what could still be the least later

    def follow(self, lead: float, quota: float, now: float, window_s: float = 0.0) -> float:
        """The weight the least lead of the last `window_s` (`lead` chunks over a `quota`
        now, and those said before) calls for: at once when higher, else one STEP down
        towards it. Leads within DEAD_BAND quotas are left alone."""
        quotas = lead / max(quota, 1.0)
        while self._leads and self._leads[-1][1] >= quotas:
            self._leads.pop()  # never the least again: this one is as low and newer
        self._leads.append((now, quotas))
        while len(self._leads) > 1 and self._leads[0][0] <= now - window_s:
            self._leads.popleft()
        least = self._leads[0][1]
        goal = 1.0 - SLOPE * max(0.0, least - DEAD_BAND)
        goal = min(1.0, max(MIN, round(goal / STEP) * STEP))
        if goal > self.value:
            self.value = goal  # the lead shrinks: no holding back what is not owed
        elif goal < self.value and now - self.changed_at >= HOLD_S:
            self.value -= STEP
            self.changed_at = now
        return self.value
