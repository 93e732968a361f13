"""When crediting runs: it yields to a burst of grabs, for a bounded time.

Crediting a grab (redpack/ledger.py) writes more rows than the grab did (its entry, two lines,
two balances, often a new wallet) on the same MySQL, and, under `make run`, on the same cores
as the web processes. Run beside a many-packets burst it took 8-22 % of the burst's grabs per
second (docs/benchmarks.md, "Crediting beside a burst"). So while grab rows are being written
at REDPACK_CREDIT_YIELD_RATE per second or faster, the crediting task credits nothing, until
REDPACK_CREDIT_MAX_WAIT seconds have passed since it began to wait; from then on it credits
whatever the rate. The wait ends only when a run has caught up with every grab (a lull between
bursts does not end it); then the task may wait again. A grab's amount reaches its wallet
within about one interval at a lower rate, and within about REDPACK_CREDIT_MAX_WAIT seconds
and the time to catch up under a longer burst.

The rate is read off the grab rows, where every web process and persister writes them (they
may be many, on other machines): the highest grab row id of each database (the primary key's
end, one index dive), against the highest seen by the previous look at least WINDOW seconds
earlier. It counts ids taken, so the few a failed INSERT takes count too; a shard's ids step
by the number of shards (settings.configure_shard). The previous look and the time waiting
began are in Redis, timed by Redis's clock, shared by every worker process. Unlike the
persister's surge (strategies/redis_queue_async/persister.py), which reads its own stream,
crediting has no queue of its own in which grabs arrive: the grab rows are its queue.

Without Redis, or with a database that does not answer the look, crediting does not wait.

One run at a time (`one_run`): beat asks for a run every REDPACK_CREDIT_INTERVAL, and a run
lasts up to REDPACK_CREDIT_RUN_SECONDS; without a lease, a backlog (the grabs of a long burst,
or of a worker that was down) had every worker process crediting at once, and the persister of
redis_queue_async, expiry and the heartbeat queued behind them: a burst's grabs reached MySQL
12-22 s after their answers instead of within one persist interval (docs/operations.md).
"""

import contextlib
import json
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Max
from django_redis import get_redis_connection
from redis.exceptions import RedisError

from . import shards
from .models import GrabDetail

LOOK_KEY = "rp:credit:look"  # hash: at (Redis time, s), ids (JSON: alias -> highest id), rate
WAITING_KEY = "rp:credit:waiting_since"  # Redis time (s) the task began to wait
WINDOW = 0.5  # seconds: a look closer than this to the previous one reuses its rate
RUN_KEY = "rp:credit:running"  # the token of the crediting run under way, with a lease
# Seconds the lease outlives a run's REDPACK_CREDIT_RUN_SECONDS: a run stops between batches
# once its time is up, and a batch takes milliseconds; a run killed mid-way holds crediting back
# this much longer at most. A run that outlives its lease (a long lock wait) may overlap the
# next: each grab is credited once all the same.
RUN_LEASE_MARGIN = 10.0

QUIET, WAIT, OVERDUE = "quiet", "wait", "overdue"

# Delete a key only if it still holds the value given: stop waiting only if the wait is still
# the one this run saw (another worker's may be newer); end a run's lease only if it is its own.
_DELETE_IF_SAME = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@contextlib.contextmanager
def one_run(seconds: float) -> Iterator[bool]:
    """Whether this crediting run may go on: no other holds the lease (taken for `seconds` and
    RUN_LEASE_MARGIN, released at the end; a run killed mid-way leaves it to lapse). Without
    Redis every run goes on (two at once credit each grab once all the same: the ledger's
    UNIQUE per grab row), as before the lease."""
    token = secrets.token_hex(8)
    lease_ms = int((seconds + RUN_LEASE_MARGIN) * 1000)
    try:
        client = get_redis_connection("default")
        taken = bool(client.set(RUN_KEY, token, nx=True, px=lease_ms))
    except RedisError:
        yield True
        return
    if not taken:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(RedisError):
            # Only if still this run's: one that outlived its lease may find another's.
            client.eval(_DELETE_IF_SAME, 1, RUN_KEY, token)


def _highest_ids() -> dict[str, int]:
    ids = {}
    for alias in shards.each():
        ids[alias] = GrabDetail.objects.using(alias).aggregate(top=Max("pk"))["top"] or 0
    return ids


def _redis_now(client: Any) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def grab_rate(client: Any, now: float | None = None) -> float | None:
    """Grab rows written per second between the previous look and this one, at `now` (Redis's
    time, read if not given) (None: no previous look, or one from Redis's future). A look less
    than WINDOW after the previous one reuses its rate. Each database's highest id is kept as a
    high-water mark: rows deleted at the top do not make the next look count them again."""
    if now is None:
        now = _redis_now(client)
    last = client.hgetall(LOOK_KEY)
    age = now - float(last[b"at"]) if last else None
    if age is not None and 0 <= age < WINDOW:
        rate = last.get(b"rate")
        return None if rate is None else float(rate)
    before: dict[str, int] = json.loads(last[b"ids"]) if last else {}
    ids = {alias: max(top, before.get(alias, top)) for alias, top in _highest_ids().items()}
    sample: dict[str, str | float] = {"at": now, "ids": json.dumps(ids)}
    rate = None
    if age is not None and age > 0:
        step = len(settings.REDPACK_SHARDS) or 1
        written = sum(top - before.get(alias, top) for alias, top in ids.items()) / step
        sample["rate"] = rate = written / age
    pipe = client.pipeline(transaction=True)
    pipe.delete(LOOK_KEY)
    pipe.hset(LOOK_KEY, mapping=sample)
    pipe.execute()
    return rate


class Pace:
    """One crediting run's view of the pace: its verdict, and a `burst_began` to ask between
    its transactions, which asks Redis at most once per WINDOW of `clock`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.since: bytes | None = None  # the wait this run saw, if any
        self.verdict = self._look()
        self._asked = clock()

    def _look(self) -> str:
        """QUIET: grabs are written slower than REDPACK_CREDIT_YIELD_RATE per second (or that
        rate is 0: crediting never waits); WAIT: faster, and the task has waited less than
        REDPACK_CREDIT_MAX_WAIT seconds; OVERDUE: faster, and it has waited that long."""
        if settings.REDPACK_CREDIT_YIELD_RATE <= 0:
            return QUIET
        try:
            client = get_redis_connection("default")
            now = _redis_now(client)
            rate = grab_rate(client, now)
            if rate is None or rate < settings.REDPACK_CREDIT_YIELD_RATE:
                # A lull does not end the wait: a run that catches up does (caught_up).
                self.since = client.get(WAITING_KEY)
                return QUIET
            pipe = client.pipeline(transaction=True)
            pipe.set(WAITING_KEY, repr(now), nx=True)
            pipe.get(WAITING_KEY)
            _, self.since = pipe.execute()
        except (RedisError, DatabaseError):  # no look: the money is not held back for it
            return QUIET
        waited = 0.0 if self.since is None else now - float(self.since)
        # A wait from Redis's future (its clock stepped back) has waited long enough.
        return WAIT if 0 <= waited < settings.REDPACK_CREDIT_MAX_WAIT else OVERDUE

    def burst_began(self) -> bool:
        """For a run that began in a quiet moment: stop, grabs come fast again."""
        if self.clock() - self._asked < WINDOW:
            return False
        self._asked = self.clock()
        return self._look() == WAIT

    def caught_up(self) -> None:
        """A run credited every grab: the wait it saw, if any, is over, and the next fast look
        waits anew (a newer wait, begun by another worker meanwhile, goes on)."""
        if self.since is None:
            return
        # Without Redis, the next fast look finds the old wait overdue, and credits.
        with contextlib.suppress(RedisError):
            get_redis_connection("default").eval(_DELETE_IF_SAME, 1, WAITING_KEY, self.since)
