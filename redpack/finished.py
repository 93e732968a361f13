"""A fast "no": once an activity is sold out or closed, grabs are answered without its strategy.

In a hot burst almost every request comes after the last packet is gone. Each of those used to
run the strategy (a row lock in MySQL, a script in Redis) only to hear `sold_out`; now a
process that has seen the end answers from memory.

How a process learns it: from a grab's own answer (`sold_out` or `closed`), which it also writes
to Redis (`rp:finished:<id>`, expiring after REDPACK_FINISHED_SECONDS) for the other processes;
a grab request reads that key in the round trip it makes anyway for its throttle and ban check
(redpack/api/gate.py). Nothing is asked per request that was not asked before. Once a process
knows, a grab request it can answer from memory asks nothing at all (`answer_now`): no round
trip; the ban is asked of the process's copy of the set (redpack/bans.py), and the throttle
does not count an answer that grants nothing and costs less than counting it would. In a hot
burst that is every request after the last packet.

What the answer is, in the contract's order: `closed` to everybody once closed (or expired);
once sold out, `already_grabbed` with the amount for a user who holds a packet, else
`sold_out`. The holders (at most the activity's packets) are read once per process and period
from where the strategy keeps them (GrabStrategy.holders); a user whose grab is not settled
yet (a mark in Redis whose row is still being written), or any user of an activity with more
than REDPACK_FINISHED_MAX_HOLDERS holders, is answered by the strategy as before.

Why sold out is answered only when settled: a packet taken and not yet written can still come
back (a write that fails gives it back, and its batch's `sold_out` answers become `contended`);
so sold out is answered from memory only while no grab is being written (no mark in Redis
without its row). Closed is final and never replaced by sold out. Memory lasts no longer than
the flag it was learned from, so REDPACK_FINISHED_SECONDS bounds how long an end is believed
(0 turns the fast answers off).

How the memory is kept while a burst lasts: past RENEW_SHARE of its life, one request per
RENEW_RETRY_SHARE of the period (per process and activity) is sent to the strategy again while
the others are still answered from memory; a final answer of the strategy from then on renews
the memory (its holders read again) and the flag for a whole period (`learn`), and a grant
then (a packet given back) ends a sold-out memory and its flag. Without it, every process's
memory and the flag ended together every period, and every request in flight at that moment
went to the strategy (a row lock each, for the MySQL strategies) before one answer taught the
process again.

Grabs that started before the process knew the end and then waited in it for their turn
(strategies/turns.py, the one-grab strategies) are answered by `answer` after the wait, once
it knows (strategies.base.known_answer, set by services), instead of each going on to its
lock in turn only to hear `sold_out`.
"""

import logging
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone
from django_redis import get_redis_connection
from redis.exceptions import RedisError

from redpack import metrics, selectors
from redpack.hotsettings import hot
from redpack.models import GrabDetail
from redpack.money import to_cents
from strategies import registry
from strategies.base import GrabResult, Holders, Outcome, TooMany

logger = logging.getLogger(__name__)

clock = time.monotonic  # what the memory ages by (tests set it)
FINAL = {Outcome.SOLD_OUT, Outcome.CLOSED}
MAX_REMEMBERED = 1024  # activities one process remembers at most (then it starts afresh)
NEVER = float("-inf")


def key(activity_id: int) -> str:
    return f"rp:finished:{activity_id}"


@dataclass
class _Seen:
    outcome: Outcome
    until: float
    # Read by the first sold_out answer that needs them (the others wait for it); False: too
    # many to keep, or not readable: the strategy answers until this memory expires.
    holders: Holders | bool | None = None
    read_at: float = 0.0
    reading: threading.Lock = field(default_factory=threading.Lock)
    renew_from: float = 0.0  # from then on, a request now and then asks the strategy again
    renew_asked: float = NEVER  # when the last such request was let through


_lock = threading.Lock()
_seen: dict[int, _Seen] = {}
UNSETTLED_REREAD_SECONDS = 0.05  # holders with grabs still being written are read again after
RENEW_SHARE = 0.5  # of a memory's life, after which it is renewed from the strategy
# A request sent to renew the memory that did not renew it (its user holds a packet, say: the
# strategy answers already_grabbed) lets the next one through after this share of the period.
RENEW_RETRY_SHARE = 0.05

# Sold out never replaces closed, in Redis either: a batch answered `sold_out` before a close
# can finish after it.
_SHARE_SOLD_OUT = """
if redis.call('GET', KEYS[1]) == 'closed' then return 0 end
redis.call('SET', KEYS[1], 'sold_out', 'PX', ARGV[1])
return 1
"""
_UNSHARE_SOLD_OUT = """
if redis.call('GET', KEYS[1]) == 'sold_out' then return redis.call('DEL', KEYS[1]) end
return 0
"""


def enabled() -> bool:
    return hot.REDPACK_FINISHED_SECONDS > 0


def known(activity_id: int) -> bool:
    """Whether this process remembers the activity as finished (its grabs are answered from
    memory, `answer`)."""
    if not enabled():
        return False
    seen = _seen.get(activity_id)  # one dict read: atomic, no lock for every request
    return seen is not None and seen.until > clock()


def answer(
    activity_id: int,
    user_id: int,
    shared: str | bytes | None = None,
    shared_ttl_ms: int | None = None,
) -> GrabResult | None:
    """The answer for a finished activity, or None: ask the strategy.

    `shared`, `shared_ttl_ms`: the value of the activity's Redis flag and the milliseconds it
    has left, read by the request's gate (None when not read or not there)."""
    if not enabled():
        return None
    now = clock()
    seen = _seen.get(activity_id)
    if seen is not None and seen.until <= now:
        seen = None
    told = _outcome(shared)
    # Closed is final and wins over a sold out remembered here (another process closed it).
    newer = seen is None or (told is Outcome.CLOSED and seen.outcome is not Outcome.CLOSED)
    if told is not None and newer:
        seconds = settings.REDPACK_FINISHED_SECONDS
        if shared_ttl_ms is not None and shared_ttl_ms > 0:
            seconds = min(seconds, shared_ttl_ms / 1000)  # no longer than the flag lives
        seen = _remember(activity_id, told, now, seconds)
    if seen is None or _renewing(seen, now):
        return None
    return _from_memory(activity_id, user_id, seen, now)


def answer_now(activity_id: int, user_id: int) -> GrabResult | None:
    """The answer from this process's memory alone, for a request that has asked Redis nothing
    (services.grab_answered_from_memory): None when the memory cannot answer without the
    strategy (not known, holders unsettled or not readable), and for a request due to renew it,
    which takes the usual way (`answer`)."""
    if not enabled():
        return None
    now = clock()
    seen = _seen.get(activity_id)
    if seen is None or seen.until <= now or _due(seen, now):
        return None
    return _from_memory(activity_id, user_id, seen, now)


def _from_memory(activity_id: int, user_id: int, seen: _Seen, now: float) -> GrabResult | None:
    """What a remembered end answers this user, in the contract's order; None while a grab is
    still being written (or the holders cannot be read): the strategy answers."""
    if seen.outcome is Outcome.CLOSED:
        return GrabResult(Outcome.CLOSED)
    holders = _holders(activity_id, seen, now)
    # A grab still being written may yet be given back (a failed write): until every grab is
    # settled, sold out is not final, and the strategy answers.
    if holders is None or holders.unsettled:
        return None
    if selectors.activity_facts(activity_id)[1] <= timezone.now():
        return GrabResult(Outcome.CLOSED)  # sold out, and now expired too: closed comes first
    cents = holders.cents.get(user_id)
    if cents is not None:
        return GrabResult(Outcome.ALREADY_GRABBED, cents)
    return GrabResult(Outcome.SOLD_OUT)


def learn(activity_id: int, result: GrabResult) -> None:
    """Remember a strategy's final answer and tell the other processes (best effort: a process
    that does not hear of it learns from its own next answer). Sold out never replaces
    closed. A final answer past the memory's `renew_from` renews it: a new memory, whose
    holders are read again. A grant after a request was sent to renew a sold-out memory (a
    packet given back) ends that memory, and the flag."""
    if not enabled():
        return
    if result.outcome is Outcome.GRABBED:
        _forget_sold_out(activity_id)
        return
    if result.outcome not in FINAL:
        return
    now = clock()
    seen = _seen.get(activity_id)
    seconds = settings.REDPACK_FINISHED_SECONDS
    if seen is not None and seen.until > now:
        closed_already = seen.outcome is Outcome.CLOSED and result.outcome is not Outcome.CLOSED
        not_due = seen.outcome is result.outcome and now < seen.renew_from
        if closed_already or not_due:
            return  # sold out never replaces closed; a known end is renewed once due
    _remember(activity_id, result.outcome, now, seconds)
    ttl_ms = max(1, int(seconds * 1000))
    try:
        client = get_redis_connection("default")
        if result.outcome is Outcome.CLOSED:
            client.set(key(activity_id), Outcome.CLOSED.value, px=ttl_ms)
        else:
            client.eval(_SHARE_SOLD_OUT, 1, key(activity_id), ttl_ms)
    except RedisError as exc:
        metrics.store_error(exc, "finished_flag")
        logger.warning("activity %s: could not share that it is %s: %s", activity_id, result, exc)


def _forget_sold_out(activity_id: int) -> None:
    """A grant after a request was sent to renew the sold-out memory: a packet was given back
    (a grant of the batch that sold out, learned just after its sold_out, is not one)."""
    seen = _seen.get(activity_id)
    if seen is None or seen.outcome is not Outcome.SOLD_OUT or seen.renew_asked == NEVER:
        return
    with _lock:
        if _seen.get(activity_id) is seen:
            del _seen[activity_id]
    try:
        get_redis_connection("default").eval(_UNSHARE_SOLD_OUT, 1, key(activity_id))
    except RedisError as exc:
        metrics.store_error(exc, "finished_flag")
        logger.warning("activity %s: could not take back that it is sold out: %s", activity_id, exc)


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


def _remember(activity_id: int, outcome: Outcome, now: float, seconds: float) -> _Seen:
    seen = _Seen(outcome, now + seconds, renew_from=now + RENEW_SHARE * seconds)
    with _lock:
        if len(_seen) >= MAX_REMEMBERED:
            _seen.clear()
        _seen[activity_id] = seen
    return seen


def _renewing(seen: _Seen, now: float) -> bool:
    """Whether this request goes to the strategy to renew the memory: past `renew_from`, one
    request per RENEW_RETRY_SHARE of the period (the first whose answer is final renews it)."""
    if not _due(seen, now):
        return False  # read without the lock: every request of a burst asks
    with _lock:
        if not _due(seen, now):
            return False
        seen.renew_asked = now
    return True


def _due(seen: _Seen, now: float) -> bool:
    """Whether a request now would be the one sent to renew the memory (`_renewing`)."""
    retry = RENEW_RETRY_SHARE * settings.REDPACK_FINISHED_SECONDS
    return now >= seen.renew_from and now - seen.renew_asked >= retry


def _holders(activity_id: int, seen: _Seen, now: float) -> Holders | None:
    """The activity's holders, read once per memory period (again shortly while some grab is
    still being written); None when there are too many to keep or they could not be read.

    Once read and settled they do not change for the memory's life, so the requests after the
    first read them without the lock: in a burst every thread of the process asks, and a lock
    taken by each would make them wait in turn for whichever holder the GIL has set aside."""
    read = seen.holders
    if read is False:
        return None
    if isinstance(read, Holders) and not read.unsettled:
        return read
    with seen.reading:
        stale = isinstance(seen.holders, Holders) and bool(seen.holders.unsettled)
        if seen.holders is None or (stale and now - seen.read_at >= UNSETTLED_REREAD_SECONDS):
            seen.holders, seen.read_at = _read_holders(activity_id), now
    return seen.holders if isinstance(seen.holders, Holders) else None


def _read_holders(activity_id: int) -> Holders | bool:
    """From the strategy, or the grab rows in MySQL; False above REDPACK_FINISHED_MAX_HOLDERS
    (counted before anything large is read) or when they cannot be read now."""
    at_most = settings.REDPACK_FINISHED_MAX_HOLDERS
    try:
        strategy = registry.get(selectors.activity_strategy(activity_id))
        holders = strategy.holders(activity_id=activity_id, at_most=at_most)
        if holders is None:  # the grab rows in MySQL say it
            rows = GrabDetail.objects.filter(activity_id=activity_id)
            amounts = list(rows.values_list("user_id", "amount")[: at_most + 1])
            if len(amounts) > at_most:
                return False
            holders = Holders({user: to_cents(amount) for user, amount in amounts})
    except TooMany:
        return False
    except Exception:  # noqa: BLE001 - the strategy answers instead
        logger.warning("activity %s: holders not readable now", activity_id, exc_info=True)
        return False
    return holders
