"""Fixed-window rate limits counted atomically in Redis, for the API throttles and the login
endpoints alike.

One window per (scope, who, period): INCR and EXPIRE NX in one script run, so concurrent
requests cannot all read "under the limit" and then all pass (DRF's cache throttle reads a list
and writes it back, which lets a burst through). The same run makes the other reads a grab
request needs before its work (`count_and_read`: the bans set, the activity's finished flag;
redpack/api/gate.py), so a request sends Redis one command, on its thread's own connection
(strategies/lua: no pool checkout). With Redis away the limits fail open to a per-process
counter of the same shape (logged once a minute): a MySQL strategy keeps answering grabs, and
a login flood still meets a limit in each web process.
"""

import logging
import math
import threading
import time
from dataclasses import dataclass

from redis.exceptions import RedisError

from redpack import metrics
from strategies.lua import gate_script, run_script_pinned

logger = logging.getLogger(__name__)

PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
clock = time.time  # the windows' clock (tests set it)


@dataclass(frozen=True)
class Rate:
    limit: int
    seconds: int

    @classmethod
    def parse(cls, text: str) -> "Rate":
        """DRF's notation: "120/min", "10/m", "1000/hour", "5/s"."""
        count, _, period = text.partition("/")
        return cls(int(count), PERIODS[period.strip()[:1]])


@dataclass(frozen=True)
class Window:
    """The current window of one (scope, who, rate): its Redis key and when it ends."""

    scope: str
    key: str
    rate: Rate
    ends_at: float

    @property
    def expire_seconds(self) -> int:
        """How long Redis keeps the window's count: a second past its end."""
        return self.rate.seconds + 1

    def wait(self, count: int, now: float) -> float | None:
        """None when `count` requests fit the window, else the seconds until it ends (counted in
        metrics.THROTTLED), and this process remembers the window as over (`known_over`). A
        strategy that carries a request's checks finds it over the rate in its script
        (lua/checks.lua `checked`, the same `count > limit`) and asks this for the wait."""
        if count <= self.rate.limit:
            return None
        if _over.note(self.key, count, self.ends_at, now):
            logger.warning(
                "rate limit reached",
                extra={
                    "event": "throttled",
                    "scope": self.scope,
                    "window": self.key,
                    "count": count,
                    "limit": self.rate.limit,
                },
            )
        return self.throttled(now)

    def known_over(self, now: float) -> bool:
        """Whether this process has already found the window over its limit (`wait`): a
        window's count only grows until it ends, so every further request in it is over too
        (while the limit is not raised past the count found), and is answered `throttled`
        without being counted."""
        found = _over.count(self.key, now)
        return found is not None and found > self.rate.limit

    def throttled(self, now: float) -> float:
        """The seconds until the window ends, for a request over it (counted in
        metrics.THROTTLED)."""
        metrics.THROTTLED.labels(self.scope).inc()
        return max(1.0, math.ceil(self.ends_at - now))


def window(scope: str, who: str, rate: Rate, now: float) -> Window:
    index = int(now // rate.seconds)
    return Window(scope, f"rp:rate:{scope}:{who}:{index}", rate, (index + 1) * rate.seconds)


@dataclass(frozen=True)
class Read:
    count: int | None  # the window's count so far, this request included (None: not counted)
    member: bool
    value: bytes | None
    ttl_ms: int | None  # the read key's PTTL (-2: no such key); None: not read


def count_and_read(
    current: Window | None,
    *,
    member_of: tuple[str, int | str] | None = None,
    read: str | None = None,
) -> Read:
    """In one script run: count one request in `current`'s window, look for a member in a set
    (`member_of`: the set's key and the member), and read a key with its PTTL (`read`). Raises
    RedisError when Redis did not answer (the count may or may not have been made)."""
    keys: list[str] = []
    args: list[int | str] = ["", "", ""]
    if current is not None:
        keys.append(current.key)
        args[0] = current.expire_seconds
    if member_of is not None:
        keys.append(member_of[0])
        args[1] = member_of[1]
    if read is not None:
        keys.append(read)
        args[2] = 1
    count, member, value, ttl = run_script_pinned(gate_script("count_and_read"), keys, args)
    return Read(
        count=None if count is None else int(count),
        member=bool(member),
        value=value,
        ttl_ms=None if ttl is None else int(ttl),
    )


def count_locally(current: Window, now: float, error: RedisError) -> int:
    """The count when Redis did not answer: this process's own (logged once a minute)."""
    _local.warn(error)
    return _local.count(current.key, current.ends_at + 1, now)


def hit(scope: str, who: str, rate: Rate) -> float | None:
    """Count one request; None when allowed, else the seconds until the window ends."""
    now = clock()
    current = window(scope, who, rate, now)
    if current.known_over(now):
        return current.throttled(now)
    try:
        so_far = count_and_read(current).count or 0
    except RedisError as exc:
        so_far = count_locally(current, now, exc)
    return current.wait(so_far, now)


class _LocalCounters:
    """The fallback while Redis is away: the same windows, in this process only."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, tuple[int, float]] = {}  # key -> (count, forget after)
        self.warned_at = 0.0

    def count(self, key: str, forget_after: float, now: float) -> int:
        with self.lock:
            if len(self.counts) > 100_000:
                self.counts = {k: v for k, v in self.counts.items() if v[1] > now}
            count = self.counts.get(key, (0, forget_after))[0] + 1
            self.counts[key] = (count, forget_after)
            return count

    def warn(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self.warned_at >= 60:
            self.warned_at = now
            logger.warning("rate limits counted in this process only: Redis is away (%s)", exc)


_local = _LocalCounters()


class _OverLimit:
    """The windows this process has found over their limit, until they end: key -> (the count
    found, the window's end)."""

    MAX_KEPT = 100_000

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.windows: dict[str, tuple[int, float]] = {}

    def note(self, key: str, count: int, ends_at: float, now: float) -> bool:
        """Remember the window as over; True when this process had not found it so before."""
        with self.lock:
            if len(self.windows) >= self.MAX_KEPT:
                self.windows = {k: v for k, v in self.windows.items() if v[1] > now}
                if len(self.windows) >= self.MAX_KEPT:
                    return False  # that many over their limit at once: the rest count in Redis
            before = self.windows.get(key)
            self.windows[key] = (max(count, before[0] if before else 0), ends_at)
            return before is None

    def count(self, key: str, now: float) -> int | None:
        found = self.windows.get(key)
        return None if found is None or found[1] <= now else found[0]


_over = _OverLimit()


def forget() -> None:
    """Drop this process's memory of windows found over their limit (tests)."""
    global _over
    _over = _OverLimit()
