"""One Redis lock per activity around the whole grab transaction (seed 001, 基于分布式锁).

What it locks: `rp:{<activity_id>}:lock` in Redis (redis-py's Lock: SET NX PX with a random
token, released by a script that deletes the key only if the token is still ours), held from
before the transaction begins until after it commits. Grabs of one activity run in series,
MySQL sees no contention on the row.
What it checks twice: open / already grabbed / sold out once without the lock, so repeat
clicks and late comers never queue for it, then again under the lock before writing. And the
write itself is fenced: a lock can expire under a paused process (GC, swap, a slow disk), and
then a second holder runs beside it. So the decrement is `UPDATE … WHERE id=? AND version=?`
with the version read under the lock: 0 rows means someone wrote since, and the transaction
rolls back with `contended`. The lock makes grabs orderly; the version makes them correct.
Round trips: 1 read before the lock (the activity with the user's grab), SET NX (polled while
waiting), START TRANSACTION with the same read (one query), UPDATE + INSERT + COMMIT, the
release script.
Failure mode: throughput is one lock hand-off per grab, and redis-py's Lock polls (no queue,
no fairness), so waiters burn round trips and one who waits longer than REDPACK_LOCK_WAIT is
turned away with `contended` while packets remain.
In one process, a grab waits for the activity's turn (turns.py) before it asks for the lock:
one thread per process polls Redis, the others sleep on a Python lock and the next one asks as
soon as the holder lets go, instead of at its next poll; the turn and the lock share one
REDPACK_LOCK_WAIT (docs/benchmarks.md, "A turn in front of the Redis lock"). The price is
fairness between processes: the process that held the lock asks again at once, the others at
their next poll, so under sustained load one web process can keep the lock while another's
grabs (and a close, which takes no turn) wait out their time.
"""

import logging
import time
from typing import Any

from django.conf import settings
from django.db import IntegrityError
from django_redis import get_redis_connection
from redis.exceptions import LockNotOwnedError, RedisError
from redis.lock import Lock

from redpack import allocation, shards
from redpack.hotsettings import hot
from redpack.models import Activity
from redpack.money import to_cents

from . import turns
from .base import CloseResult, GrabResult, GrabStrategy, Outcome
from .steps import (
    GrabRow,
    after_duplicate,
    close_row_locked,
    execute_raw,
    grab_transaction,
    read_for_grab,
    read_for_grab_sql,
    record_grab,
    record_grab_raw,
    refusal,
)

logger = logging.getLogger(__name__)

# How often a waiter retries SET NX: redis-py's default. Shorter polls hand the lock over sooner
# when few wait, but hundreds of waiters then spend the CPU the holder needs (400 clicks on 2
# cores: polling every 0.02 s turned 85% away as `contended`, every 0.1 s 19%).
LOCK_POLL_SECONDS = 0.1


def lock_key(activity_id: int) -> str:
    return f"rp:{{{activity_id}}}:lock"


def activity_lock(activity_id: int, *, wait: float) -> Lock:
    return get_redis_connection("default").lock(
        lock_key(activity_id),
        timeout=settings.REDPACK_LOCK_TIMEOUT,
        blocking_timeout=wait,
        sleep=LOCK_POLL_SECONDS,
    )


class DistributedLockStrategy(GrabStrategy):
    name = "distributed_lock"
    label = "Redis lock per activity"
    tradeoff = "Grabs of an activity queue on one Redis lock; a fenced UPDATE covers lock expiry."
    uses_redis = True

    def prepare(self, activity: Activity) -> None:
        """Nothing to prepare: the lock is created by the first grab and expires on its own."""

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        activity, held = read_for_grab(activity_id=activity_id, user_id=user_id, lock=False)
        answer = refusal(activity, user_id=None, held=held)
        if answer is not None:
            return answer
        # Outermost on the hot path, so the turn is never taken inside a transaction; a turn
        # not had in time raises NoTurn, answered `contended` as InnoDB's lock wait timeout is.
        wait = hot.REDPACK_LOCK_WAIT
        give_up = time.monotonic() + wait
        with turns.turn(activity_id, wait=wait, ask_known=True):
            lock = activity_lock(activity_id, wait=max(0.0, give_up - time.monotonic()))
            if not lock.acquire():
                return GrabResult(Outcome.CONTENDED)
            try:
                return self._grab_locked(activity_id=activity_id, user_id=user_id)
            finally:
                _release(lock)

    def _grab_locked(self, *, activity_id: int, user_id: int) -> GrabResult:
        try:
            # Outermost on the hot path (a request, the bench): leaving the block is the
            # commit, and the lock is released only after that.
            with grab_transaction():
                activity, held = read_for_grab(activity_id=activity_id, user_id=user_id, lock=False)
                answer = refusal(activity, user_id=None, held=held)
                if answer is not None:
                    return answer
                cents = allocation.draw(
                    activity.allocation, to_cents(activity.surplus_amount), activity.surplus_count
                )
                if not record_grab(
                    activity_id=activity_id, user_id=user_id, cents=cents, version=activity.version
                ):
                    logger.warning("fenced: activity %s changed under its lock", activity_id)
                    return GrabResult(Outcome.CONTENDED)
                return GrabResult(Outcome.GRABBED, cents)
        except IntegrityError as exc:
            return after_duplicate(activity_id=activity_id, user_id=user_id, error=exc)

    def close(self, *, activity_id: int) -> CloseResult:
        # Any holder is done or expired within the lock timeout. Closing without the lock, or
        # inside a caller's longer transaction, is still correct: the row lock and the version
        # bump fence the grabs in flight, which then answer `contended` instead of finishing.
        lock = activity_lock(activity_id, wait=settings.REDPACK_LOCK_TIMEOUT)
        locked = lock.acquire()
        if not locked:
            logger.warning("closing activity %s without its Redis lock", activity_id)
        try:
            with shards.atomic():
                return close_row_locked(activity_id=activity_id)
        finally:
            if locked:
                _release(lock)

    def raw_grab(self, cursor: Any, *, activity_id: int, user_id: int) -> None:
        """grab()'s statements on a plain cursor, inside the same redis-py Lock (waiting up to
        the lock's timeout rather than answering `contended`: every call is a grab)."""
        cursor.execute(*read_for_grab_sql(activity_id=activity_id, user_id=user_id, lock=False))
        lock = activity_lock(activity_id, wait=settings.REDPACK_LOCK_TIMEOUT)
        if not lock.acquire():
            raise RuntimeError(f"lock {lock.name} not acquired")
        try:
            read = read_for_grab_sql(activity_id=activity_id, user_id=user_id, lock=False)
            execute_raw(cursor, read, begin=True)
            version = cursor.fetchone()[5]
            row = GrabRow(user_id, 100)
            record_grab_raw(cursor, activity_id=activity_id, row=row, version=version)
            cursor.execute("COMMIT")
        finally:
            lock.release()


def _release(lock: Lock) -> None:
    """Token-checked release; a lock that expired meanwhile is reported, never deleted. A
    release Redis did not answer is reported too: the grab's transaction is over, whatever it
    answered stands, and the lock lapses after REDPACK_LOCK_TIMEOUT."""
    try:
        lock.release()
    except LockNotOwnedError:
        logger.warning("lock %s expired before release; raise REDPACK_LOCK_TIMEOUT", lock.name)
    except RedisError as exc:
        logger.warning("lock %s not released (%r): it lapses on its own", lock.name, exc)
