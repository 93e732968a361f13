"""Pre-split packets in a Redis list, popped by one Lua script (seed 001 基于Redis队列, seed 002).

Send: the total is cut at once (allocation.split) into t_redpack rows, pushed to the list
rp:{id}:packets when the send commits. Grab: concurrent grabs of the activity in this process
join a batch (strategies/combiner.py); one EVALSHA (lua/grab.lua, popping) checks closed and
expired, dedupes, pops a packet and records user -> packet for every member, atomically; then
one MySQL transaction (group commit) marks the winners' packets TAKEN, decrements the surplus
once and writes their detail rows (steps.record_grabs: the claim first, so the activity row is
held for the rest only), and only then is each winner answered `grabbed`. If that write
fails, each grab is written on its own, and lua/release.lua puts back the packet of one that was
not written and removes its mark in one step: nothing is lost and the user may retry.

What it locks: nothing in Redis (the script is the critical section); in MySQL, each batch's
transaction ends on the hot activity row. What it checks twice: a repeated click that finds the
user's mark answers `already_grabbed` once MySQL holds the first click's row, waiting while that
write is in flight, so a write that then fails was never reported; a mark no write follows
(its attempt lost its reply, or died) is taken over and written by the repeated click. Round
trips: one EVALSHA and at most one MySQL transaction per batch; losers never touch MySQL.

`redis_queue_single` is the seeds' form: the same script and write, one grab per round trip.
"""

from typing import Any

from redpack.models import Activity

from .lua import script
from .redis_state import RedisStateStrategy
from .redis_state.keys import Keys, new_attempt, now_ms, parse_mark
from .steps import GrabRow, commit_grabs_raw, split_into_packets


class RedisQueueStrategy(RedisStateStrategy):
    name = "redis_queue"
    label = "Redis list + Lua pop, batched"
    tradeoff = (
        "One EVALSHA pops pre-split packets for a batch of concurrent grabs; one MySQL "
        "transaction writes the batch's winners before they are answered."
    )

    def prepare(self, activity: Activity) -> None:
        split_into_packets(activity)
        super().prepare(activity)


class RedisQueueSingleStrategy(RedisQueueStrategy):
    name = "redis_queue_single"
    label = "Redis list + Lua pop, one grab at a time"
    tradeoff = (
        "The seeds' form of redis_queue: one EVALSHA and one MySQL transaction per grab; "
        "the winners' writes serialize on the activity row."
    )
    batched = False
    raw_batch = None  # one grab per transaction: its raw ceiling is raw_grab's

    def raw_grab(self, cursor: Any, *, activity_id: int, user_id: int) -> None:
        """grab()'s work on a plain cursor: one grab script run for one user (redis-py,
        EVALSHA), then its row written in one transaction (rows.write_grab's statements)."""
        reply = script("grab")(
            keys=Keys(activity_id).ordered(), args=[now_ms(), "pop", 0, user_id, new_attempt(), ""]
        )
        cents, packet_id = parse_mark(reply[2].decode())
        row = GrabRow(user_id, cents, packet_id)
        if not commit_grabs_raw(cursor, activity_id=activity_id, rows=[row], begin=True):
            # as write_grab: the packet Redis gave is not free in MySQL
            cursor.execute("ROLLBACK")
            raise RuntimeError(f"packet {packet_id} is not available at {cents} cents in MySQL")
