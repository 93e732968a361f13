"""redis_queue_async's persister: acknowledged grabs move from Redis to MySQL (seed 001, 异步入库).

Where grabs wait. The grab script appends {user, mark} to the activity's Redis Stream
`rp:{<id>}:persist` in the step that pops the packet. A stream with a consumer group rather
than the seed's BRPOPLPUSH into a backup list: the group's pending entries list records which
entry was delivered to which consumer, when, and how many times, so a crashed consumer's
entries are found by their idle time (XAUTOCLAIM) instead of being guessed from a backup list
and checked against MySQL one by one. An entry leaves the stream (XACK + XDEL,
lua/persisted.lua) only after its batch committed, so the stream's length is exactly the
number of grabs still on their way to MySQL.

Which activities. One stream per activity keeps every grab on one slot of a Redis Cluster, and
the grab script cannot also touch a global "dirty" key (another slot). So the strategy adds each
activity to the set `rp:async:activities` once its state is installed (send, rebuild), and the
persister reads the length of every member's stream in one pipeline. A member leaves the set when
its activity is closed in Redis (or its state is gone) and its stream is empty: no grab can come
after that. The reclaim run puts back every open activity that MySQL knows, should the set lose
one.

Runs. Celery beat starts `persist_grabs` every REDPACK_PERSIST_INTERVAL: new entries are read
with XREADGROUP, REDPACK_PERSIST_BATCH at a time, round-robin over the busy activities, one MySQL
transaction per batch. `reclaim_grabs` (every REDPACK_PERSIST_RECLAIM_INTERVAL) takes over the
entries delivered more than REDPACK_PERSIST_RECLAIM_SECONDS ago and never acknowledged (their
consumer died between reading and XACK) and persists them the same way. `settle` does both for
one activity, in the caller's process.

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
event on the redpack.persist.failures logger; at REDPACK_PERSIST_MAX_ATTEMPTS it is dead: it
leaves the stream, and only the admin's "retry" action (retry_failure) brings it to MySQL.
Until then its activity is not settled, so its sender is not refunded.
"""

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone
from redis.exceptions import ResponseError

from strategies.lua import redis_client, script
from strategies.redis_state import Keys, mark, parse_mark

from .models import (
    Activity,
    ActivityStatus,
    GrabDetail,
    Packet,
    PacketStatus,
    PersistFailure,
    PersistFailureStatus,
)
from .money import from_cents, minus, to_cents

logger = logging.getLogger(__name__)
failure_log = logging.getLogger("redpack.persist.failures")

GROUP = "persisters"
INDEX_KEY = "rp:async:activities"
UNAVAILABLE = (OperationalError, InterfaceError)
UNRESOLVED = [PersistFailureStatus.RETRYING, PersistFailureStatus.DEAD]
SETTLE_POLL_SECONDS = 0.05


class DatabaseUnavailable(Exception):
    """MySQL did not answer: the run stops, its entries stay pending and are not counted."""


class Conflict(Exception):
    """MySQL holds something that contradicts the grab."""


class ActivityGone(Exception):
    """The activity's row was deleted (the lab's ceiling runs do): its grabs have nowhere to go."""


@dataclass(frozen=True)
class Entry:
    """One grab in a persist stream."""

    entry_id: str
    user_id: int
    mark: str  # "cents:packet_id"

    @classmethod
    def parse(cls, entry_id: bytes | str, fields: dict[bytes, bytes]) -> "Entry":
        text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return cls(text, int(fields[b"user"]), fields[b"mark"].decode())

    @property
    def cents(self) -> int:
        return parse_mark(self.mark)[0]

    @property
    def packet_id(self) -> int | None:
        return parse_mark(self.mark)[1]


def _id_ms(entry_id: bytes) -> int:
    """When the grab happened: a stream id starts with Redis's clock in milliseconds."""
    return int(entry_id.partition(b"-")[0])


def _redis() -> Any:
    """The packet state's Redis (or Cluster). redis-py annotates each command as sync-or-async;
    this client is sync."""
    return redis_client()


def consumer() -> str:
    """This process's name in the consumer group; its unacknowledged entries carry it."""
    return f"{socket.gethostname()}:{os.getpid()}"


# --- the index of asynchronous activities -------------------------------------------------


def register(activity_id: int) -> None:
    _redis().sadd(INDEX_KEY, activity_id)


def registered() -> list[int]:
    return sorted(int(member) for member in _redis().smembers(INDEX_KEY))


def _backlog(activity_ids: list[int]) -> dict[int, int]:
    """Grabs waiting in each activity's stream (pending or not yet delivered), in one pipeline."""
    pipe = _redis().pipeline(transaction=False)
    for activity_id in activity_ids:
        pipe.xlen(Keys(activity_id).persist)
    return dict(zip(activity_ids, pipe.execute(), strict=True))


def _retire_finished(activity_ids: list[int]) -> None:
    """Drop from the index the activities no grab can come to any more and nothing waits for.

    The status is read before the length: once closed (or gone) an activity stays so, and an
    empty stream of a closed activity stays empty.
    """
    client = _redis()
    pipe = client.pipeline(transaction=False)
    for activity_id in activity_ids:
        keys = Keys(activity_id)
        pipe.hget(keys.meta, "status")
        pipe.xlen(keys.persist)
    replies = pipe.execute()
    finished = [
        activity_id
        for activity_id, status, waiting in zip(
            activity_ids, replies[::2], replies[1::2], strict=True
        )
        if status != b"open" and waiting == 0
    ]
    if finished:
        client.srem(INDEX_KEY, *finished)


def asynchronous_strategies() -> list[str]:
    """The configured strategies whose grabs this module persists."""
    from strategies import registry
    from strategies.redis_queue_async import RedisQueueAsyncStrategy  # it imports this module

    return [n for n in registry.names() if isinstance(registry.get(n), RedisQueueAsyncStrategy)]


def _register_open_activities() -> None:
    """Put back into the index every open asynchronous activity (if Redis lost the index)."""
    open_ids = list(
        Activity.objects.filter(
            strategy__in=asynchronous_strategies(), status=ActivityStatus.OPEN
        ).values_list("pk", flat=True)
    )
    if open_ids:
        _redis().sadd(INDEX_KEY, *open_ids)


# --- reading the streams ------------------------------------------------------------------


def _ensure_group(stream: str) -> bool:
    """Create the consumer group (from the stream's start: nothing is skipped); False when the
    stream does not exist, so there is nothing to read."""
    try:
        _redis().xgroup_create(stream, GROUP, id="0")
    except ResponseError as exc:
        return "BUSYGROUP" in str(exc)
    return True


def _read_new(activity_id: int, count: int) -> list[Entry]:
    """Entries never delivered to any consumer; they are this process's to acknowledge now."""
    stream = Keys(activity_id).persist
    for _ in range(2):
        try:
            reply = _redis().xreadgroup(GROUP, consumer(), {stream: ">"}, count=count)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            if not _ensure_group(stream):
                return []
            continue
        return [Entry.parse(i, fields) for _, entries in reply or [] for i, fields in entries]
    return []


def _claim_stale(
    activity_id: int, *, min_idle_ms: int, start: str, count: int
) -> tuple[str, list[Entry]]:
    """Take over entries delivered more than min_idle_ms ago and never acknowledged."""
    try:
        reply = _redis().xautoclaim(
            Keys(activity_id).persist,
            GROUP,
            consumer(),
            min_idle_time=min_idle_ms,
            start_id=start,
            count=count,
        )
    except ResponseError as exc:
        if "NOGROUP" in str(exc):
            return "0-0", []
        raise
    cursor, claimed = reply[0], reply[1]
    cursor = cursor.decode() if isinstance(cursor, bytes) else cursor
    # Redis 6.2 lists an entry deleted meanwhile as nil; 7 drops it from the pending list.
    return cursor, [Entry.parse(i, fields) for i, fields in claimed if fields]


def _hand_back(activity_id: int, entry_ids: list[str]) -> None:
    """Entries this process could not persist (MySQL away) are marked idle long enough for the
    next reclaim run to take them, rather than after REDPACK_PERSIST_RECLAIM_SECONDS."""
    _redis().xclaim(
        Keys(activity_id).persist,
        GROUP,
        consumer(),
        min_idle_time=0,
        message_ids=entry_ids,
        idle=int(settings.REDPACK_PERSIST_RECLAIM_SECONDS * 1000),
        justid=True,
    )


def _acknowledge(activity_id: int, entry_ids: list[str]) -> None:
    keys = Keys(activity_id)
    for start in range(0, len(entry_ids), 1000):  # Lua's unpack() has a bounded stack
        script("persisted")(
            keys=[keys.meta, keys.persist], args=[GROUP, *entry_ids[start : start + 1000]]
        )


# --- writing MySQL ------------------------------------------------------------------------


def _fault_pause(point: str) -> None:
    """Fault tests only (REDPACK_PERSIST_FAULT_PAUSE): sleep here so the test can kill us."""
    where, _, seconds = settings.REDPACK_PERSIST_FAULT_PAUSE.partition(":")
    if where == point:
        logger.warning("persist: fault pause %s for %s s (pid %s)", point, seconds, os.getpid())
        time.sleep(float(seconds))


def _store(activity_id: int, entries: list[Entry], *, redelivered: bool) -> int:
    """One transaction: the grabs MySQL does not have yet; returns how many were inserted."""
    with transaction.atomic():
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
        _fault_pause("before_commit")
    return len(fresh)


def _not_yet_recorded(activity_id: int, entries: list[Entry]) -> list[Entry]:
    """The entries without a row; an entry whose user holds another packet is a Conflict."""
    held = {
        user_id: mark(to_cents(amount), packet_id)
        for user_id, amount, packet_id in GrabDetail.objects.filter(
            activity_id=activity_id, user_id__in={e.user_id for e in entries}
        ).values_list("user_id", "amount", "redpack_id")
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
    by_packet = {e.packet_id: e for e in fresh if e.packet_id is not None}
    available = dict(
        Packet.objects.filter(
            activity_id=activity_id, pk__in=list(by_packet), status=PacketStatus.AVAILABLE
        ).values_list("pk", "amount")
    )
    for entry in fresh:
        packet_id = entry.packet_id
        takes_it = (
            packet_id is not None
            and by_packet[packet_id] == entry  # no other entry of the batch names that packet
            and packet_id in available
            and to_cents(available[packet_id]) == entry.cents
        )
        if not takes_it:
            raise Conflict(
                f"packet {entry.packet_id} is not available at {from_cents(entry.cents)} in MySQL"
            )
    GrabDetail.objects.bulk_create(
        [
            GrabDetail(
                activity_id=activity_id,
                user_id=e.user_id,
                amount=from_cents(e.cents),
                redpack_id=e.packet_id,
            )
            for e in fresh
        ]
    )
    Packet.objects.filter(pk__in=list(by_packet)).update(
        status=PacketStatus.TAKEN,
        grabbed_by_id=Case(*[When(pk=e.packet_id, then=Value(e.user_id)) for e in fresh]),
        version=F("version") + 1,
    )
    Activity.objects.filter(pk=activity_id).update(
        surplus_count=F("surplus_count") - len(fresh),
        surplus_amount=minus("surplus_amount", sum(e.cents for e in fresh)),
        version=F("version") + 1,
    )


def _persist_batch(activity_id: int, entries: list[Entry], *, redelivered: bool) -> int:
    try:
        return _persist(activity_id, entries, redelivered=redelivered)
    except DatabaseUnavailable:
        _hand_back(activity_id, [e.entry_id for e in entries])
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
        _redis().srem(INDEX_KEY, activity_id)
        return 0
    except (DatabaseError, Conflict) as exc:
        if len(entries) > 1:  # find the bad ones: each entry on its own
            return sum(_persist(activity_id, [e], redelivered=redelivered) for e in entries)
        return _failed(activity_id, entries[0], exc)
    _fault_pause("before_ack")
    _acknowledge(activity_id, [e.entry_id for e in entries])
    return len(entries)


def _failed(activity_id: int, entry: Entry, error: Exception) -> int:
    """Count a failure of this entry on its own; at the limit it goes to the dead letters."""
    now = timezone.now()
    text = f"{type(error).__name__}: {error}"
    try:
        with transaction.atomic():
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
        _acknowledge(activity_id, [entry.entry_id])
        return 1
    return 0


# --- runs ---------------------------------------------------------------------------------


def _reclaim(activity_id: int, *, min_idle_ms: int, until: float) -> int:
    """One pass over the activity's pending entries, persisting those left too long."""
    moved, cursor = 0, "0-0"
    while time.monotonic() < until:
        cursor, entries = _claim_stale(
            activity_id, min_idle_ms=min_idle_ms, start=cursor, count=settings.REDPACK_PERSIST_BATCH
        )
        if entries:
            moved += _persist_batch(activity_id, entries, redelivered=True)
        if cursor == "0-0":
            break
    return moved


def _persist_next_batch(activity_id: int) -> int:
    """Read and persist one batch of new entries; how many were read (0: none left)."""
    entries = _read_new(activity_id, settings.REDPACK_PERSIST_BATCH)
    if entries:
        _persist_batch(activity_id, entries, redelivered=False)
    return len(entries)


def persist_all(*, run_seconds: float) -> int:
    """The beat task's run: new entries of every busy activity, a batch each in turn."""
    until = time.monotonic() + run_seconds
    read = 0
    try:
        busy = [a for a, waiting in _backlog(registered()).items() if waiting]
        while busy and time.monotonic() < until:
            still_busy = []
            for activity_id in busy:
                if n := _persist_next_batch(activity_id):
                    read += n
                    still_busy.append(activity_id)
            busy = still_busy
    except DatabaseUnavailable as exc:
        logger.warning("persist: MySQL unavailable, grabs wait in Redis: %s", exc)
    return read


def reclaim_all(*, min_idle_seconds: float, run_seconds: float) -> int:
    """The crash-recovery run: entries their consumer never acknowledged; then tidy the index."""
    until = time.monotonic() + run_seconds
    moved = 0
    try:
        _register_open_activities()
        activity_ids = registered()
        for activity_id, waiting_grabs in _backlog(activity_ids).items():
            if waiting_grabs:
                moved += _reclaim(
                    activity_id, min_idle_ms=int(min_idle_seconds * 1000), until=until
                )
        _retire_finished(activity_ids)
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
    return waiting(activity_id) == 0 and not dead_letters(activity_id)


def settle(activity_id: int, *, timeout: float) -> bool:
    """Help the persister with one activity until it is settled, or False at the timeout."""
    give_up = time.monotonic() + timeout
    while True:
        try:
            drain(activity_id, until=give_up)
            if waiting(activity_id) == 0:
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
        with transaction.atomic():
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


# --- lag ----------------------------------------------------------------------------------


def waiting(activity_id: int) -> int:
    """Grabs of the activity not yet in MySQL (dead letters aside)."""
    return int(_redis().xlen(Keys(activity_id).persist))


def dead_letters(activity_id: int | None = None) -> int:
    """Failed grabs not yet in MySQL (retrying or dead), of one activity or all."""
    failures = PersistFailure.objects.filter(status__in=UNRESOLVED)
    if activity_id is not None:
        failures = failures.filter(activity_id=activity_id)
    return failures.count()


def lag() -> dict[str, int | float]:
    """Grabs answered but not yet in MySQL, and the age of the oldest, from Redis alone (it
    answers while MySQL does not). Ages use this machine's clock against Redis's ids."""
    activity_ids = registered()
    pipe = _redis().pipeline(transaction=False)
    for activity_id in activity_ids:
        stream = Keys(activity_id).persist
        pipe.xlen(stream)
        pipe.xrange(stream, count=1)
    replies = pipe.execute()
    pending = sum(replies[::2])
    oldest = [_id_ms(first[0][0]) for first in replies[1::2] if first]
    age = max(0.0, time.time() - min(oldest) / 1000) if oldest else 0.0
    return {"pending": pending, "oldest_age_seconds": round(age, 3)}
