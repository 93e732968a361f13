"""Bounded retries with a small jittered backoff, for the strategies that lose races by design."""

import random
import time
from collections.abc import Iterator

from django.conf import settings


def attempts(max_retries: int) -> Iterator[int]:
    """Yield attempt numbers 0..max_retries, sleeping before each retry.

    Full jitter (uniform in [0, base × 2^retry]) spreads the losers of one round so they do not
    all collide again in the next; the bound keeps a grab's latency finite.
    """
    base = settings.REDPACK_RETRY_BACKOFF
    for attempt in range(max_retries + 1):
        if attempt:
            time.sleep(random.uniform(0, base * 2 ** (attempt - 1)))
        yield attempt
