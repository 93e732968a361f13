"""Where the Redis strategies keep an activity, and how a grab is written there.

Keys of one activity share the hash tag `rp:{<id>}:`, so every script touches one slot and runs
unchanged on Redis Cluster: `rp:{42}:meta`, `rp:{42}:count`, `rp:{42}:grabbed`,
`rp:{42}:packets` (lua/install.lua describes each), distributed_lock's `rp:{42}:lock`
and redis_queue_async's persist stream `rp:{42}:persist`. A grab is recorded in Redis as a
mark, `cents[:packet_id]`, which is also how redis_queue lists a packet, followed in the grabbed
hash by `|attempt`, the token of the grab call that made it.
"""

import itertools
import logging
import os
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from redis.exceptions import ConnectionError, TimeoutError

from redpack.errors import OutcomeUnknown
from redpack.hotsettings import hot

from ..lua import run_pinned

logger = logging.getLogger(__name__)

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


def split_held(held: str) -> tuple[str, str]:
    """A grabbed-hash value: (mark, the attempt that made it; '' for a mark rebuilt from MySQL)."""
    mark_text, _, attempt = held.partition("|")
    return mark_text, attempt


def new_attempt() -> str:
    """A token for one grab call: its script runs, and re-runs, under it. Unique without a
    system call per grab: a random prefix drawn once per process (again in a forked child, so
    that two workers never share one) and the process's next number."""
    return f"{_attempts.prefix}{next(_attempts.numbers):x}"


class _Attempts:
    __slots__ = ("prefix", "numbers")

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self.prefix = secrets.token_hex(6) + "."  # 48 random bits per process
        self.numbers = itertools.count()  # next() is atomic under the GIL


_attempts = _Attempts()
os.register_at_fork(after_in_child=_attempts.renew)


@dataclass(frozen=True)
class GrabReply:
    """What the grab script (lua/grab.lua) answered for one user."""

    outcome: str
    mark: str | None = None
    epoch: str | None = None  # of the state it ran on
    holder: str | None = None  # already_grabbed: the attempt that made the mark


def run_grabs(
    keys: list[str], members: list[tuple[int, str, str]], *extra: int | str
) -> list[GrabReply]:
    """Run the grab script (lua/grab.lua, `extra` its ARGV before the users) for a batch of
    (user, attempt, checks: request_checks.checks_arg), settling a lost reply; one reply per
    member, in order.

    Outcome unknown: when the connection drops or times out after the request left, the script
    may have run. The scripts are idempotent per attempt, so the same call is sent again on a
    new connection (REDPACK_REDIS_GRAB_RERUNS times): it returns the first run's answers, never
    a second packet. The client itself re-sends nothing (settings: its retries are off). If
    Redis still does not answer, OutcomeUnknown (503 with Retry-After) for the whole batch: the
    marks may be in Redis, and each user's retry converges on its own
    (RedisStateStrategy.adopt).
    """
    args: list[int | str] = [now_ms(), *extra]
    for user_id, attempt, checks in members:
        args += [user_id, attempt, checks]
    for run in range(hot.REDPACK_REDIS_GRAB_RERUNS + 1):
        try:
            reply = run_pinned("grab", keys, args)
        except (ConnectionError, TimeoutError) as exc:
            logger.warning("grab: reply %d lost (%s); the outcome is unknown", run + 1, exc)
            lost = exc
            continue
        epoch = reply[0].decode() or None
        parts = [part.decode() for part in reply[1:]]
        return [
            GrabReply(
                outcome,
                mark or None,
                epoch,
                holder if outcome == "already_grabbed" else None,
            )
            for outcome, mark, holder in zip(parts[::3], parts[1::3], parts[2::3], strict=True)
        ]
    raise OutcomeUnknown(
        "the grab's reply was lost and Redis does not answer; retry to learn the outcome"
    ) from lost
