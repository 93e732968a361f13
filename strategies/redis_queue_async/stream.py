"""redis_queue_async's stream side: where acknowledged grabs wait in Redis for MySQL.

The grab script appends {user, mark} to the activity's Redis Stream `rp:{<id>}:persist` in the
step that pops the packet. A stream with a consumer group rather than the seed's BRPOPLPUSH
into a backup list: the group's pending entries list records which entry was delivered to which
consumer, when, and how many times, so a crashed consumer's entries are found by their idle time
(XAUTOCLAIM) instead of being guessed from a backup list and checked against MySQL one by one.
An entry leaves the stream (XACK + XDEL, lua/persisted.lua) only after its batch committed, so
the stream's length is exactly the number of grabs still on their way to MySQL.

Which activities. One stream per activity keeps every grab on one slot of a Redis Cluster, and
the grab script cannot also touch a global "dirty" key (another slot). So the strategy adds each
activity to the set `rp:async:activities` once its state is installed (send, rebuild), and the
persister reads the length of every member's stream in one pipeline. A member leaves the set when
its activity is closed in Redis (or its state is gone) and its stream is empty: no grab can come
after that.
"""

import os
import socket
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.conf import settings
from redis.exceptions import ResponseError

from ..lua import redis_client, script
from ..redis_state.keys import Keys, now_ms, parse_mark

GROUP = "persisters"
INDEX_KEY = "rp:async:activities"


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

    @cached_property
    def _parsed(self) -> tuple[int, int | None]:
        return parse_mark(self.mark)

    @property
    def cents(self) -> int:
        return self._parsed[0]

    @property
    def packet_id(self) -> int | None:
        return self._parsed[1]


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


def register(*activity_ids: int) -> None:
    _redis().sadd(INDEX_KEY, *activity_ids)


def unregister(activity_id: int) -> None:
    _redis().srem(INDEX_KEY, activity_id)


def registered() -> list[int]:
    return sorted(int(member) for member in _redis().smembers(INDEX_KEY))


@dataclass(frozen=True)
class Backlog:
    """An activity's stream as one look saw it: the grabs waiting (pending or not yet
    delivered), and how long ago the oldest and the newest of them were answered (0: none).
    The ages are this machine's clock against Redis's: negative when this clock is behind."""

    waiting: int
    oldest_age_ms: int = 0
    newest_age_ms: int = 0


def backlogs(activity_ids: list[int]) -> dict[int, Backlog]:
    """Each activity's Backlog, in one pipeline. Ages use this machine's clock against Redis's
    ids (a stream id starts with Redis's clock in milliseconds)."""
    pipe = _redis().pipeline(transaction=False)
    for activity_id in activity_ids:
        stream = Keys(activity_id).persist
        pipe.xlen(stream)
        pipe.xrange(stream, count=1)
        pipe.xrevrange(stream, count=1)
    replies = pipe.execute()
    now = now_ms()
    looks = {}
    for activity_id, waiting, first, last in zip(
        activity_ids, replies[::3], replies[1::3], replies[2::3], strict=True
    ):
        if first and last:
            looks[activity_id] = Backlog(
                waiting, now - _id_ms(first[0][0]), now - _id_ms(last[0][0])
            )
        else:
            looks[activity_id] = Backlog(waiting)
    return looks


def retire_finished(activity_ids: list[int]) -> None:
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


# --- reading the streams ------------------------------------------------------------------


def ensure_group(stream: str) -> bool:
    """Create the consumer group (from the stream's start: nothing is skipped); False when the
    stream does not exist, so there is nothing to read."""
    try:
        _redis().xgroup_create(stream, GROUP, id="0")
    except ResponseError as exc:
        return "BUSYGROUP" in str(exc)
    return True


def read_new(activity_id: int, count: int) -> list[Entry]:
    """Entries never delivered to any consumer; they are this process's to acknowledge now."""
    stream = Keys(activity_id).persist
    for _ in range(2):
        try:
            reply = _redis().xreadgroup(GROUP, consumer(), {stream: ">"}, count=count)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            if not ensure_group(stream):
                return []
            continue
        return [Entry.parse(i, fields) for _, entries in reply or [] for i, fields in entries]
    return []


def claim_stale(
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


def hand_back(activity_id: int, entry_ids: list[str]) -> None:
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


def acknowledge(activity_id: int, entry_ids: list[str]) -> None:
    keys = Keys(activity_id)
    for start in range(0, len(entry_ids), 1000):  # Lua's unpack() has a bounded stack
        script("persisted")(
            keys=[keys.meta, keys.persist], args=[GROUP, *entry_ids[start : start + 1000]]
        )


# --- lag ----------------------------------------------------------------------------------


def waiting(activity_id: int) -> int:
    """Grabs of the activity not yet in MySQL (dead letters aside)."""
    return int(_redis().xlen(Keys(activity_id).persist))


def lag() -> dict[str, int | float]:
    """Grabs answered but not yet in MySQL, and the age of the oldest, from Redis alone (it
    answers while MySQL does not)."""
    looks = backlogs(registered()).values()
    oldest_ms = max((look.oldest_age_ms for look in looks), default=0)
    return {
        "pending": sum(look.waiting for look in looks),
        "oldest_age_seconds": max(0, oldest_ms) / 1000,
    }
