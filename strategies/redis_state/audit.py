"""Every difference between an activity's Redis state and MySQL, in words (the auditor's
invariant 4: Redis and MySQL agree on grabbed users and amounts and on what is left)."""

from collections import Counter
from dataclasses import dataclass

from redpack.money import from_cents

from ..lua import script
from .keys import parse_mark, split_held
from .rebuild import Recorded

MAX_DIFFERENCES = 20  # the auditor names this many differences, then counts the rest


@dataclass(frozen=True)
class Snapshot:
    """One activity's Redis state read in one atomic step (lua/snapshot.lua)."""

    meta: dict[str, str]
    count: int | None
    grabbed: dict[str, str]  # user id -> mark (without the attempt that made it)
    packets: list[str]
    ttls: list[int]  # of each key, in order: -2 missing, -1 no expiry
    stream: list[tuple[str, dict[str, str]]]  # the persist stream's entries, when it was read

    @classmethod
    def read(cls, keys: list[str]) -> "Snapshot":
        meta, count, grabbed, packets, ttls, *stream = script("snapshot")(keys=keys)
        return cls(
            meta=_pairs(meta),
            count=None if count is None else int(count),
            grabbed={user: split_held(held)[0] for user, held in _pairs(grabbed).items()},
            packets=[entry.decode() for entry in packets],
            ttls=[int(ttl) for ttl in ttls],
            stream=[(entry_id.decode(), _pairs(fields)) for entry_id, fields in stream[0]]
            if stream
            else [],
        )


def differences(
    recorded: Recorded, state: Snapshot, *, mysql_status: str, refunded: bool
) -> list[str]:
    """What the Redis state says that MySQL (plus what is on its way there) does not."""
    found: list[str] = []
    redis_status = state.meta["status"]
    if (redis_status == "open") != (mysql_status == "open"):
        found.append(f"activity is {mysql_status} in MySQL but {redis_status} in Redis")
    found += _grab_differences(recorded.grabs, state.grabbed)
    if not refunded:  # a refund empties MySQL, not Redis
        found += _left_differences(recorded, state)
    return found


def capped(found: list[str]) -> list[str]:
    if len(found) <= MAX_DIFFERENCES:
        return found
    return [*found[:MAX_DIFFERENCES], f"and {len(found) - MAX_DIFFERENCES} more differences"]


def _pairs(flat: list[bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}


def _show(mark_text: str | None) -> str:
    if mark_text is None:
        return "nothing"
    cents, packet_id = parse_mark(mark_text)
    return f"{from_cents(cents)}" + ("" if packet_id is None else f" (packet {packet_id})")


def _grab_differences(recorded: dict[str, str], in_redis: dict[str, str]) -> list[str]:
    return [
        f"user {user} has {_show(recorded.get(user))} in MySQL but {_show(in_redis.get(user))} "
        f"in Redis"
        for user in sorted(recorded.keys() | in_redis.keys(), key=int)
        if recorded.get(user) != in_redis.get(user)
    ]


def _left_differences(recorded: Recorded, state: Snapshot) -> list[str]:
    differences = []
    if state.count != recorded.count:
        differences.append(f"{recorded.count} packets left in MySQL but {state.count} in Redis")
    redis_cents = int(state.meta["remaining_cents"])
    if redis_cents != recorded.cents:
        differences.append(
            f"{from_cents(recorded.cents)} left in MySQL but {from_cents(redis_cents)} in Redis"
        )
    available = recorded.available
    listed = Counter(state.packets)
    for entry in sorted(available.keys() | listed.keys()):
        if available[entry] == listed[entry]:
            continue
        cents, packet_id = parse_mark(entry)
        if listed[entry] == 0:
            differences.append(
                f"packet {packet_id} ({from_cents(cents)}) available in MySQL but not in Redis list"
            )
        elif available[entry] == 0:
            differences.append(
                f"packet {packet_id} ({from_cents(cents)}) in Redis list but not available in MySQL"
            )
        else:
            differences.append(f"packet {packet_id} is in the Redis list {listed[entry]} times")
    return differences
