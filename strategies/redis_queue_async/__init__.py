"""Redis queue, asynchronous persistence (seed 001 基于Redis队列,异步入库; seed 002's batch writer).

Send: as redis_queue (pre-split t_redpack rows, pushed to the list rp:{id}:packets when the send
commits); the activity also joins the index the persister scans. Grab: concurrent grabs of the
activity in this process join a batch (strategies/combiner.py); one EVALSHA (lua/grab.lua
with the persist stream as fifth key) checks closed and expired, dedupes, pops a packet, records
user -> packet and appends {user, packet} to the stream rp:{id}:persist for every member,
atomically, and the answers come from Redis alone: `grabbed` means "in the stream", not "in
MySQL". A repeated click finds the mark and answers `already_grabbed` at once. MySQL is not on
the path (selectors.activity_strategy reads an activity's strategy name from MySQL once per
process and keeps it; a missing Redis state reads the activity row once, as for redis_queue).

Persist: persister.py (MySQL side) and stream.py (Redis side), run by Celery beat and workers
through the strategy's background tasks, moves grabs to MySQL in batches,
one transaction each, and takes them out of the stream only after the commit; `settle` waits
for an activity's stream to empty, and helps by persisting it in the caller's process.

What it locks: nothing on the grab path; the persister locks the activity row once per batch.
What it checks twice: the persister, under that lock, skips users MySQL already holds, so a
grab delivered twice writes once. Round trips: one EVALSHA per batch of grabs; MySQL gets ~6
statements per batch of up to REDPACK_PERSIST_BATCH grabs. The price: until persisted, an
acknowledged grab lives only in Redis, so that Redis needs AOF (appendfsync everysec loses at
most about a second of grabs if its machine dies) and noeviction; MySQL trails by the persist
lag, during a surge by about REDPACK_PERSIST_SURGE_LAG (persister.surging).
"""

import logging
import time
from collections import Counter
from collections.abc import Mapping

from django.conf import settings

from redpack import shards
from redpack.models import UNRESOLVED_FAILURES, Activity, PersistFailure

from ..base import (
    BackgroundTask,
    CloseResult,
    GrabResult,
    NotRebuildable,
    Outcome,
    PendingWrites,
    RequestChecks,
    StrategyHealth,
)
from ..lua import script
from ..redis_queue import RedisQueueStrategy
from ..redis_state.audit import Snapshot
from ..redis_state.keys import Keys, new_attempt, now_ms, parse_mark
from ..redis_state.rebuild import Recorded
from ..redis_state.rows import Won
from ..request_checks import checks_arg
from ..steps import close_row_locked
from . import persister, stream

logger = logging.getLogger(__name__)

INSTALL_SETTLE_SECONDS = 30.0  # a rebuild first waits this long for pending grabs to persist


class RedisQueueAsyncStrategy(RedisQueueStrategy):
    name = "redis_queue_async"
    label = "Redis list + Lua pop, persisted later"
    tradeoff = (
        "One EVALSHA pops a packet and queues the grab in a Redis stream; the answer needs no "
        "MySQL, which Celery fills in batches, so MySQL trails by the persist lag."
    )
    raw_batch = None  # nothing is written to MySQL inside the request

    def state_keys(self, activity_id: int) -> list[str]:
        keys = Keys(activity_id)
        return [*keys.ordered(), keys.persist]

    def install(self, activity_id: int) -> bool:
        """Write the state from MySQL once MySQL holds every grab (install.lua refuses before)."""
        if persister.dead_letters(activity_id):
            raise NotRebuildable(
                f"activity {activity_id} has grabs that failed to persist: retry them in the "
                "admin (Persist failures) before rebuilding its Redis state"
            )
        give_up = time.monotonic() + INSTALL_SETTLE_SECONDS
        while not super().install(activity_id):
            if time.monotonic() >= give_up:
                raise NotRebuildable(f"activity {activity_id}: grabs still wait to persist")
            persister.drain(activity_id, until=give_up)
        stream.register(activity_id)  # after the state exists: the index drops stateless ones
        return True

    def rebuild(self, *, activity_id: int) -> None:
        """No fence: its grabs are final in Redis, and install.lua refuses while any of them is
        still on its way to MySQL, in the same atomic step."""
        self.install(activity_id)

    marks_are_final = True  # in the stream is durable: see grab

    def grab_checking(
        self, activity_id: int, user_id: int, checks: RequestChecks | None
    ) -> GrabResult:
        # A mark made by an earlier attempt (even one whose reply was lost) is on its way to
        # MySQL, so `already_grabbed` needs no check and every decision is an answer.
        decided = self.decide(activity_id, user_id, new_attempt(), checks_arg(checks))
        assert isinstance(decided, GrabResult)
        return decided

    def write(self, activity_id: int, won: list[Won]) -> list[GrabResult | Exception]:
        """Nothing to write before the answer: the script put the grabs in the stream."""
        return [GrabResult(Outcome.GRABBED, parse_mark(grab.mark)[0]) for grab in won]

    def close(self, *, activity_id: int) -> CloseResult:
        """Close in Redis, where the truth is: what it holds then is what is left, once the
        grabs before the close have persisted (settle). Then in MySQL."""
        in_redis = script("close")(
            keys=Keys(activity_id).ordered(),
            args=[now_ms(), settings.REDPACK_REDIS_STATE_GRACE * 1000],
        )
        with shards.atomic():
            in_mysql = close_row_locked(activity_id=activity_id)
        if in_redis is not None:
            return CloseResult(*in_redis)
        # No state: it expired long after the activity did, or Redis lost it (and with it the
        # grabs not yet persisted). MySQL is the record.
        return in_mysql

    def settle(self, *, activity_id: int, timeout: float) -> bool:
        return persister.settle(activity_id, timeout=timeout)

    def health(self) -> StrategyHealth | None:
        """Grabs waiting in Redis and the oldest one's age, read once, from Redis alone."""
        lag = stream.lag()
        return StrategyHealth(float(lag["oldest_age_seconds"]), {"persist": lag})

    def pending_writes(self, *, activity_id: int) -> PendingWrites | None:
        return PendingWrites(stream.waiting(activity_id), persister.dead_letters(activity_id))

    def background_tasks(self) -> Mapping[str, BackgroundTask]:
        return {"persist": persister.persist_run, "reclaim": persister.reclaim_run}

    def retry_failed_write(self, *, failure_id: int) -> str | None:
        return persister.retry_failure(failure_id)

    def audit(self, activity: Activity) -> list[str]:
        """Redis against MySQL plus the grabs on their way, read with the activity row locked so
        that no batch commits between the two reads."""
        with shards.atomic():
            locked = Activity.objects.select_for_update().get(pk=activity.pk)
            differences = super().audit(locked)
            failed = PersistFailure.objects.filter(
                activity=locked, status__in=UNRESOLVED_FAILURES
            ).count()
        if failed:
            differences.append(f"{failed} grabs failed to persist (see Persist failures)")
        return differences

    def recorded(self, activity: Activity, state: Snapshot) -> Recorded:
        """MySQL, plus the grabs still in the stream and those that failed to persist."""
        recorded = super().recorded(activity, state)
        failed = PersistFailure.objects.filter(
            activity=activity, status__in=UNRESOLVED_FAILURES
        ).values_list("payload", flat=True)
        on_the_way = [(fields["user"], fields["mark"]) for _, fields in state.stream] + [
            (payload["user"], payload["mark"]) for payload in failed
        ]
        for user, mark in on_the_way:
            if user in recorded.grabs:
                continue  # committed, not yet acknowledged: MySQL has it already
            recorded.grabs[user] = mark
            recorded.count -= 1
            recorded.cents -= parse_mark(mark)[0]
            recorded.available[mark] -= 1
        recorded.available = Counter({m: n for m, n in recorded.available.items() if n})
        return recorded

    def ttl_differences(self, keys: list[str], state: Snapshot) -> list[str]:
        """While it holds grabs the stream never expires (lua/grab.lua), by design."""
        holding = f"{keys[-1]} never expires" if state.stream else None
        return [d for d in super().ttl_differences(keys, state) if d != holding]
