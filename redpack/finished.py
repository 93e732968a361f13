"""A fast "no": once an activity is sold out or closed, grabs are answered without its strategy.

In a hot burst almost every request comes after the last packet is gone. Each of those used to
run the strategy (a row lock in MySQL, a script in Redis) only to hear `sold_out`; now a
process that has seen the end answers from memory.

How a process learns it: from a grab's own answer (`sold_out` or `closed`), which it also writes
to Redis (`rp:finished:<id>`, expiring after REDPACK_FINISHED_SECONDS) for the other processes;
a grab request reads that key in the round trip it makes anyway for its throttle and ban check
(redpack/api/gate.py). Nothing is asked per request that was not asked before.

What the answer is, in the contract's order: `closed` to everybody once closed (or expired);
once sold out, `already_grabbed` with the amount for a user who holds a packet, else
`sold_out`. The holders (at most the activity's packets) are read once per process and period
from where the strategy keeps them (GrabStrategy.holders); a user whose grab is not settled
yet (a mark in Redis whose row is still being written), or any user of an activity with more
than REDPACK_FINISHED_MAX_HOLDERS holders, is answered by the strategy as before.

Why it expires: closed is final, and so is sold out for the strategies that write MySQL first;
a Redis strategy can give a packet back (a write that failed after Redis took it), and that
packet can be grabbed again once every process's memory of the end has expired.
"""

import logging
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone
from django_redis import get_redis_connection
from redis.exceptions import RedisError

from redpack import selectors
from redpack.models import GrabDetail
from redpack.money import to_cents
from strategies import registry
from strategies.base import GrabResult, Holders, Outcome

logger = logging.getLogger(__name__)

clock = time.monotonic  # what the memory ages by (tests set it)
FINAL = {Outcome.SOLD_OUT, Outcome.CLOSED}
MAX_REMEMBERED = 1024  # activities one process remembers at most (then it starts afresh)


def key(activity_id: int) -> str:
    return f"rp:finished:{activity_id}"


@dataclass
class _Seen:
    outcome: Outcome
    until: float
    # Read by the first sold_out answer that needs them (the others wait for it); False: too
    # many to keep, or not readable: the strategy answers until this memory expires.
    holders: Holders | bool | None = None
    reading: threading.Lock = field(default_factory=threading.Lock)


_lock = threading.Lock()
_seen: dict[int, _Seen] = {}


def answer(activity_id: int, user_id: int, shared: str | bytes | None = None) -> GrabResult | None:
    """The answer for a finished activity, or None: ask the strategy.

    `shared`: the value of the activity's Redis key, read by the request's gate (None when it
    was not read or not there)."""
    now = clock()
    with _lock:
        seen = _seen.get(activity_id)
    if seen is not None and seen.until <= now:
        seen = None
    told = _outcome(shared)
    # Closed is final and wins over a sold out remembered here (another process closed it).
    newer = seen is None or (told is Outcome.CLOSED and seen.outcome is not Outcome.CLOSED)
    if told is not None and newer:
        seen = _remember(activity_id, told, now)
    if seen is None:
        return None
    if seen.outcome is Outcome.CLOSED:
        return GrabResult(Outcome.CLOSED)
    holders = _holders(activity_id, seen)
    if holders is None or user_id in holders.unsettled:
        return None
    if selectors.activity_facts(activity_id)[1] <= timezone.now():
        return GrabResult(Outcome.CLOSED)  # sold out, and now expired too: closed comes first
    cents = holders.cents.get(user_id)
    if cents is not None:
        return GrabResult(Outcome.ALREADY_GRABBED, cents)
    return GrabResult(Outcome.SOLD_OUT)


def learn(activity_id: int, result: GrabResult) -> None:
    """Remember a strategy's final answer and tell the other processes (best effort: a process
    that does not hear of it learns from its own next answer)."""
    if result.outcome not in FINAL:
        return
    now = clock()
    with _lock:
        seen = _seen.get(activity_id)
        if seen is not None and seen.until > now and seen.outcome is result.outcome:
            return
    _remember(activity_id, result.outcome, now)
    try:
        get_redis_connection("default").set(
            key(activity_id),
            result.outcome.value,
            px=max(1, int(settings.REDPACK_FINISHED_SECONDS * 1000)),
        )
    except RedisError as exc:
        logger.warning("activity %s: could not share that it is %s: %s", activity_id, result, exc)


def _outcome(shared: str | bytes | None) -> Outcome | None:
    if not shared:
        return None
    try:
        outcome = Outcome(shared.decode() if isinstance(shared, bytes) else shared)
    except ValueError:
        return None
    return outcome if outcome in FINAL else None


def forget() -> None:
    """Drop this process's memory (tests)."""
    with _lock:
        _seen.clear()


def _remember(activity_id: int, outcome: Outcome, now: float) -> _Seen:
    seen = _Seen(outcome, now + settings.REDPACK_FINISHED_SECONDS)
    with _lock:
        if len(_seen) >= MAX_REMEMBERED:
            _seen.clear()
        _seen[activity_id] = seen
    return seen


def _holders(activity_id: int, seen: _Seen) -> Holders | None:
    """The activity's holders, read once per memory period; None when there are too many to
    keep or they could not be read."""
    with seen.reading:
        if seen.holders is None:
            seen.holders = _read_holders(activity_id)
    return seen.holders if isinstance(seen.holders, Holders) else None


def _read_holders(activity_id: int) -> Holders | bool:
    try:
        strategy = registry.get(selectors.activity_strategy(activity_id))
        holders = strategy.holders(activity_id=activity_id)
        if holders is None:  # the grab rows in MySQL say it
            rows = GrabDetail.objects.filter(activity_id=activity_id)
            amounts = rows.values_list("user_id", "amount")
            holders = Holders({user: to_cents(amount) for user, amount in amounts})
    except Exception:  # noqa: BLE001 - the strategy answers instead
        logger.warning("activity %s: holders not readable now", activity_id, exc_info=True)
        return False
    if len(holders.cents) + len(holders.unsettled) > settings.REDPACK_FINISHED_MAX_HOLDERS:
        return False
    return holders
