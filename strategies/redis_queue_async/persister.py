"""redis_queue_async's persister: acknowledged grabs move from Redis to MySQL (seed 001, 异步入库).

The grabs wait in the activity's persist stream (stream.py). The reclaim run also puts back into
the index every open activity that MySQL knows, should the index lose one.

Runs. Celery beat starts the `persist` background task every REDPACK_PERSIST_INTERVAL: new entries
are read with XREADGROUP, REDPACK_PERSIST_BATCH at a time, round-robin over the busy activities,
one MySQL transaction per batch. During a surge (`surging`) an activity's grabs wait in Redis, up
to REDPACK_PERSIST_SURGE_LAG, so that the answers keep the CPU MySQL's writes would take; the
persister catches up once the surge ends. The `reclaim` task (every
REDPACK_PERSIST_RECLAIM_INTERVAL) takes over the entries delivered more than
REDPACK_PERSIST_RECLAIM_SECONDS ago and never acknowledged (their consumer died between reading
and XACK) and persists them the same way. `settle` does both for one activity, in the caller's
process, surge or not: its caller needs the activity in MySQL now.

Idempotent. A batch locks the activity row first, so the activity's writers go one at a time;
under that lock a user who already has a row is not inserted again (UNIQUE (activity, user) is
the last line). An entry delivered twice (committed, then its consumer died before XACK) writes
once, and the surplus goes down by the rows actually inserted.

Failures. MySQL unreachable (OperationalError, InterfaceError, which include lock timeouts and
deadlocks): the run stops and hands its batch back for the next reclaim run, nothing is counted;
grabs go on being answered meanwhile. Any other database error, or a conflict with MySQL (the
packet is not available at that amount, the user holds another packet), fails the batch: its
entries are then tried one by one, so one bad entry does not hold back the others. An entry
that fails on its own gets a PersistFailure row (attempts, last error) and a `persist_failed`
event on the redpack.persist.failures logger; at REDPACK_PERSIST_MAX_ATTEMPTS it is dead (a dead
letter): it leaves the stream, and only the admin's "retry" action (retry_failure) brings it to
MySQL. Until then its activity is not settled, so its sender is not refunded.
"""

import logging
import time

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError
from django.db.models import F
from django.utils import timezone

from redpack import shards
from redpack.models import (
    UNRESOLVED_FAILURES,
    Activity,
    ActivityStatus,
    PersistFailure,
    PersistFailureStatus,
)
from redpack.money import from_cents
from redpack.shards import connection

from .. import registry
from ..redis_state.keys import mark
from ..steps import GrabRow, held_marks, record_grabs
from . import stream
from .stream import Entry

logger = logging.getLogger(__name__)
failure_log = logging.getLogger("redpack.persist.failures")

UNAVAILABLE = (OperationalError, InterfaceError)
SETTLE_POLL_SECONDS = 0.05


class DatabaseUnavailable(Exception):
    """MySQL did not answer: the run stops, its entries stay pending and are not counted."""


class Conflict(Exception):
    """MySQL holds something that contradicts the grab."""


class ActivityGone(Exception):
    """The activity's row was deleted (the lab's ceiling runs do): its grabs have nowhere to go."""


def asynchronous_strategies() -> list[str]:
    """The configured strategies whose grabs this module persists: those that run its task."""
    return [
        n for n in registry.names() if persist_run in registry.get(n).background_tasks().values()
    ]


def _register_open_activities() -> None:
    """Put back into the index every open asynchronous activity (if Redis lost the index)."""
    open_ids = [
        pk
        for _ in shards.each()
        for pk in Activity.objects.filter(
            strategy__in=asynchronous_strategies(), status=ActivityStatus.OPEN
        ).values_list("pk", flat=True)
    ]
    if open_ids:
        stream.register(*open_ids)


def _store(activity_id: int, entries: list[Entry], *, redelivered: bool) -> int:
    """One transaction: the grabs MySQL does not have yet; returns how many were inserted."""
    with shards.atomic():
        status = (
            Activity.objects.select_for_update()
            .filter(pk=activity_id)
            .values_list("status", flat=True)
            .first()
        )
        if status is None:
            raise ActivityGone(activity_id)
        fresh = _not_yet_recorded(activity_id, entries)
        if fresh:
            if status == ActivityStatus.REFUNDED:
                raise Conflict("the activity was refunded before this grab reached MySQL")
            _insert(activity_id, fresh)
        if redelivered:
            PersistFailure.objects.filter(
                activity_id=activity_id,
                entry_id__in=[e.entry_id for e in entries],
                status=PersistFailureStatus.RETRYING,
            ).update(status=PersistFailureStatus.RESOLVED, resolved_at=timezone.now())
    return len(fresh)


def _not_yet_recorded(activity_id: int, entries: list[Entry]) -> list[Entry]:
    """The entries without a row; an entry whose user holds another packet is a Conflict."""
    held = {
        user_id: mark(row.cents, row.packet_id)
        for user_id, row in held_marks(
            activity_id=activity_id, user_ids={e.user_id for e in entries}
        ).items()
    }
    fresh: dict[int, Entry] = {}
    for entry in entries:
        known = held.get(entry.user_id) or (
            fresh[entry.user_id].mark if entry.user_id in fresh else None
        )
        if known is None:
            fresh[entry.user_id] = entry
        elif known != entry.mark:
            raise Conflict(
                f"user {entry.user_id} holds {known} in MySQL, the grab says {entry.mark}"
            )
    return list(fresh.values())


def _insert(activity_id: int, fresh: list[Entry]) -> None:
    """The packets' claims, the surplus and the detail rows (steps.record_grabs, as the
    request-time batches write them): the claim's UPDATE takes a packet
    only if it is still available at the entry's amount, so a packet that is not fails the
    batch (rolled back, then its entries are tried one by one)."""
    rows = [GrabRow(e.user_id, e.cents, e.packet_id) for e in fresh]
    packets = {row.packet_id for row in rows}
    if None in packets or len(packets) != len(rows):
        raise Conflict("an entry of the batch names no packet, or a packet another one names")
    if not record_grabs(activity_id=activity_id, rows=rows):
        if len(rows) == 1:
            raise Conflict(
                f"packet {rows[0].packet_id} is not available at {from_cents(rows[0].cents)}"
                " in MySQL"
            )
        raise Conflict("a packet of the batch is not available at its amount in MySQL")


def _persist_batch(activity_id: int, entries: list[Entry], *, redelivered: bool) -> int:
    try:
        with shards.for_activity(activity_id):
            return _persist(activity_id, entries, redelivered=redelivered)
    except DatabaseUnavailable:
        stream.hand_back(activity_id, [e.entry_id for e in entries])
        raise


def _persist(activity_id: int, entries: list[Entry], *, redelivered: bool) -> int:
    """Write the entries to MySQL, then take them out of the stream; how many left it."""
    try:
        _store(activity_id, entries, redelivered=redelivered)
    except UNAVAILABLE as exc:
        connection.close()  # the next attempt connects afresh
        raise DatabaseUnavailable(str(exc)) from exc
    except ActivityGone:
        logger.error("persist: activity %s is not in MySQL; it leaves the index", activity_id)
        stream.unregister(activity_id)
        return 0
    except (DatabaseError, Conflict) as exc:
        if len(entries) > 1:  # find the bad ones: each entry on its own
            return sum(_persist(activity_id, [e], redelivered=redelivered) for e in entries)
        return _failed(activity_id, entries[0], exc)
    stream.acknowledge(activity_id, [e.entry_id for e in entries])
    return len(entries)


def _failed(activity_id: int, entry: Entry, error: Exception) -> int:
    """Count a failure of this entry on its own; at the limit it goes to the dead letters."""
    now = timezone.now()
    text = f"{type(error).__name__}: {error}"
    try:
        with shards.atomic():
            failure, _ = PersistFailure.objects.select_for_update().get_or_create(
                activity_id=activity_id,
                entry_id=entry.entry_id,
                defaults={
                    "payload": {"user": str(entry.user_id), "mark": entry.mark},
                    "user_id": entry.user_id,
                    "amount": from_cents(entry.cents),
                    "packet_id": entry.packet_id,
                    "last_failed_at": now,
                },
            )
            failure.attempts += 1
            failure.error = text
            failure.last_failed_at = now
            if failure.attempts >= settings.REDPACK_PERSIST_MAX_ATTEMPTS:
                failure.status = PersistFailureStatus.DEAD
            failure.save()
    except UNAVAILABLE as exc:
        connection.close()
        raise DatabaseUnavailable(str(exc)) from exc
    failure_log.error(
        "grab not persisted",
        extra={
            "event": "persist_failed",
            "activity": activity_id,
            "entry": entry.entry_id,
            "user": entry.user_id,
            "mark": entry.mark,
            "attempts": failure.attempts,
            "status": str(failure.status),
            "error": text,
        },
    )
    if failure.status == PersistFailureStatus.DEAD:
        stream.acknowledge(activity_id, [entry.entry_id])
        return 1
    return 0


# --- runs ---------------------------------------------------------------------------------


def _reclaim(activity_id: int, *, min_idle_ms: int, until: float) -> int:
    """One pass over the activity's pending entries, persisting those left too long."""
    moved, cursor = 0, "0-0"
    while time.monotonic() < until:
        cursor, entries = stream.claim_stale(
            activity_id, min_idle_ms=min_idle_ms, start=cursor, count=settings.REDPACK_PERSIST_BATCH
        )
        if entries:
            moved += _persist_batch(activity_id, entries, redelivered=True)
        if cursor == "0-0":
            break
    return moved


def _persist_next_batch(activity_id: int) -> int:
    """Read and persist one batch of new entries; how many were read (0: none left)."""
    entries = stream.read_new(activity_id, settings.REDPACK_PERSIST_BATCH)
    if entries:
        _persist_batch(activity_id, entries, redelivered=False)
    return len(entries)


def surging(look: stream.Backlog) -> bool:
    """Peak shaving: a stream the persister leaves alone for now. While grabs pour in (at least
    a batch waits and the newest came within one persist interval) and the oldest waiting grab
    is younger than REDPACK_PERSIST_SURGE_LAG, MySQL's writes would only take the CPU from the
    answers on a shared host; once the surge ends, or the oldest grab reaches that age, the
    persister writes as fast as MySQL takes it, so a long surge trails by about that lag.
    REDPACK_PERSIST_SURGE_LAG 0: never. The ages are this machine's clock against Redis's: one
    behind by less than an interval holds a surge that much longer; one behind by more cannot
    tell a surge, and the persister writes."""
    return (
        settings.REDPACK_PERSIST_SURGE_LAG > 0
        and look.waiting >= settings.REDPACK_PERSIST_BATCH
        and abs(look.newest_age_ms) < settings.REDPACK_PERSIST_INTERVAL * 1000
        and look.oldest_age_ms < settings.REDPACK_PERSIST_SURGE_LAG * 1000
    )


def persist_all(*, run_seconds: float) -> int:
    """The beat task's run: new entries of every busy activity, a batch each in turn, the
    activities in a surge aside."""
    until = time.monotonic() + run_seconds
    read = 0
    try:
        busy = stream.registered()
        while busy and time.monotonic() < until:
            looks = stream.backlogs(busy)
            held = [a for a, look in looks.items() if look.waiting and surging(look)]
            still_busy = []
            for activity_id in [a for a, look in looks.items() if look.waiting and a not in held]:
                if n := _persist_next_batch(activity_id):
                    read += n
                    still_busy.append(activity_id)
            # An activity in a surge is looked at again while the run has other work, else by
            # the next run (one persist interval later): no worker waits out a surge.
            busy = still_busy + held if still_busy else []
    except DatabaseUnavailable as exc:
        logger.warning("persist: MySQL unavailable, grabs wait in Redis: %s", exc)
    return read


def reclaim_all(*, min_idle_seconds: float, run_seconds: float) -> int:
    """The crash-recovery run: entries their consumer never acknowledged; then tidy the index."""
    until = time.monotonic() + run_seconds
    moved = 0
    try:
        _register_open_activities()
        activity_ids = stream.registered()
        for activity_id, look in stream.backlogs(activity_ids).items():
            if look.waiting:
                moved += _reclaim(
                    activity_id, min_idle_ms=int(min_idle_seconds * 1000), until=until
                )
        stream.retire_finished(activity_ids)
    except UNAVAILABLE as exc:
        connection.close()
        logger.warning("reclaim: MySQL unavailable, grabs wait in Redis: %s", exc)
    except DatabaseUnavailable as exc:
        logger.warning("reclaim: MySQL unavailable, grabs wait in Redis: %s", exc)
    return moved


def drain(activity_id: int, *, until: float) -> int:
    """Persist what the activity's stream holds: entries left too long by another consumer,
    then new ones. Raises DatabaseUnavailable."""
    moved = _reclaim(
        activity_id, min_idle_ms=int(settings.REDPACK_PERSIST_RECLAIM_SECONDS * 1000), until=until
    )
    while time.monotonic() < until and (n := _persist_next_batch(activity_id)):
        moved += n
    return moved


def settled(activity_id: int) -> bool:
    """Every acknowledged grab of the activity is in MySQL."""
    return stream.waiting(activity_id) == 0 and not dead_letters(activity_id)


def settle(activity_id: int, *, timeout: float) -> bool:
    """Help the persister with one activity until it is settled, or False at the timeout."""
    give_up = time.monotonic() + timeout
    while True:
        try:
            drain(activity_id, until=give_up)
            if stream.waiting(activity_id) == 0:
                # Dead letters wait for a person: no use waiting out the timeout for them.
                return not dead_letters(activity_id)
        except DatabaseUnavailable:
            pass
        if time.monotonic() >= give_up:
            return False
        time.sleep(SETTLE_POLL_SECONDS)  # what is left is another consumer's batch in flight


def retry_failure(failure_id: int) -> str | None:
    """The admin's retry of a failed grab: None once it is in MySQL, else the error."""
    failure = PersistFailure.objects.get(pk=failure_id)
    if failure.status == PersistFailureStatus.RESOLVED:
        return None
    payload = failure.payload
    entry = Entry(failure.entry_id, int(payload["user"]), payload["mark"])
    try:
        with shards.atomic():
            _store(failure.activity_id, [entry], redelivered=False)
            PersistFailure.objects.filter(pk=failure_id).update(
                status=PersistFailureStatus.RESOLVED, resolved_at=timezone.now()
            )
    except UNAVAILABLE:
        raise
    except (DatabaseError, Conflict) as exc:
        text = f"{type(exc).__name__}: {exc}"
        PersistFailure.objects.filter(pk=failure_id).update(
            attempts=F("attempts") + 1, error=text, last_failed_at=timezone.now()
        )
        failure_log.error(
            "grab not persisted on retry",
            extra={
                "event": "persist_failed",
                "activity": failure.activity_id,
                "entry": failure.entry_id,
                "user": entry.user_id,
                "mark": entry.mark,
                "attempts": failure.attempts + 1,
                "status": str(failure.status),
                "error": text,
            },
        )
        return text
    logger.info("persist: grab %s of activity %s retried into MySQL", entry, failure.activity_id)
    return None


# --- the background tasks (Celery beat, redpack/tasks.py) ----------------------------------


def persist_run() -> int:
    """`persist`: move new grabs of every busy activity to MySQL."""
    return persist_all(run_seconds=settings.REDPACK_PERSIST_RUN_SECONDS)


def reclaim_run() -> int:
    """`reclaim`: persist grabs a dead consumer left pending."""
    return reclaim_all(
        min_idle_seconds=settings.REDPACK_PERSIST_RECLAIM_SECONDS,
        run_seconds=settings.REDPACK_PERSIST_RUN_SECONDS,
    )


def dead_letters(activity_id: int | None = None) -> int:
    """Failed grabs not yet in MySQL (retrying or dead), of one activity or all."""
    failures = PersistFailure.objects.filter(status__in=UNRESOLVED_FAILURES)
    if activity_id is None:
        return sum(failures.count() for _ in shards.each())
    with shards.for_activity(activity_id):
        return failures.filter(activity_id=activity_id).count()
