"""Where the Redis strategies keep an activity, and how a grab is written there.

Keys of one activity share the hash tag `rp:{<id>}:`, so every script touches one slot and runs
unchanged on Redis Cluster: `rp:{42}:meta`, `rp:{42}:count`, `rp:{42}:grabbed`,
`rp:{42}:packets` (lua/install.lua describes each), the per-user locks `rp:{42}:lock:<user>`
and redis_queue_async's persist stream `rp:{42}:persist`. A grab is recorded in Redis as a
mark, `cents[:packet_id]`, which is also how redis_queue lists a packet.
"""

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ..lua import script

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(milliseconds=1)


def now_ms() -> int:
    """The web servers' clock, the one expires_at was set by (as the MySQL strategies use)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Keys:
    activity_id: int

    @property
    def tag(self) -> str:
        return f"rp:{{{self.activity_id}}}:"

    def ordered(self) -> list[str]:
        """The KEYS of every script, in this order."""
        return [f"{self.tag}{part}" for part in ("meta", "count", "grabbed", "packets")]

    @property
    def meta(self) -> str:
        return f"{self.tag}meta"

    def lock(self, user_id: int) -> str:
        return f"{self.tag}lock:{user_id}"

    @property
    def persist(self) -> str:
        """redis_queue_async's stream of grabs on their way to MySQL."""
        return f"{self.tag}persist"


def mark(cents: int, packet_id: int | None) -> str:
    """What Redis records for a grab, and how redis_queue stores a packet: cents[:packet_id]."""
    return f"{cents}" if packet_id is None else f"{cents}:{packet_id}"


def parse_mark(text: str) -> tuple[int, int | None]:
    cents, _, packet_id = text.partition(":")
    return int(cents), int(packet_id) if packet_id else None


def run_grab(
    name: str, keys: list[str], user_id: int, *extra: int
) -> tuple[str, str | None, str | None]:
    """Run a grab script (lua/<name>.lua): (outcome, mark, epoch of the state it ran on)."""
    reply = script(name)(keys=keys, args=[user_id, now_ms(), *extra])
    outcome, mark_text, epoch = [part.decode() for part in reply] + [None] * (3 - len(reply))
    return outcome, mark_text, epoch
