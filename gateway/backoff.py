"""How long to wait before trying again, one formula for the gateway: the scheduler's retry
of a failed page, a busy replica's pause, a job callback's next attempt. Exponential from
`base_s`, capped, with optional jitter so that many waiters do not come back at once. Pure:
the random source is injected."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Backoff:
    base_s: float
    cap_s: float
    jitter: tuple[float, float] = (1.0, 1.0)  # the delay is multiplied by uniform(low, high)

    def delay(self, attempt: int, uniform: Callable[[float, float], float] = random.uniform
              ) -> float:
        """Before try `attempt + 1` (attempt 1: base_s, then doubling up to cap_s)."""
        plain = min(self.cap_s, self.base_s * 2 ** max(0, attempt - 1))
        low, high = self.jitter
        return plain if low == high == 1.0 else plain * uniform(low, high)
