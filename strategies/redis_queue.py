"""Pre-split packets in a Redis list, popped by one Lua script (seed 001 基于Redis队列, seed 002).

Send: the total is cut at once (allocation.split) into t_redpack rows, pushed to the list
rp:{id}:packets when the send commits. Grab: one EVALSHA (lua/queue_grab.lua) checks closed and
expired, dedupes, pops a packet and records user -> packet, atomically; then one MySQL
transaction writes the detail row, marks the packet TAKEN and decrements the surplus, and only
then is the answer `grabbed`. If that write fails, lua/release.lua puts the packet back and
removes the mark in one step: nothing is lost and the user may retry.

What it locks: nothing in Redis (the script is the critical section); in MySQL, each winner's
transaction ends on the hot activity row. What it checks twice: a repeated click that finds the
user's mark answers `already_grabbed` once MySQL holds the first click's row, waiting while that
write is in flight, so a write that then fails was never reported; a mark no write follows
(its attempt lost its reply, or died) is taken over and written by the repeated click. Round
trips: one EVALSHA, plus one MySQL transaction per winner (≤ total count); losers never touch
MySQL.
"""

import time

from redpack.models import Activity

from .base import GrabResult, Outcome
from .redis_state import RedisStateStrategy
from .redis_state.keys import new_attempt
from .steps import held_cents, split_into_packets

DUPLICATE_WAIT_SECONDS = 3.0  # a repeated click waits this long for the first click's write


class RedisQueueStrategy(RedisStateStrategy):
    name = "redis_queue"
    label = "Redis list + Lua pop"
    tradeoff = (
        "One atomic EVALSHA pops a pre-split packet; MySQL takes only the winners' writes, "
        "which serialize on the activity row."
    )

    def prepare(self, activity: Activity) -> None:
        split_into_packets(activity)
        super().prepare(activity)

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        attempt = new_attempt()
        give_up = time.monotonic() + DUPLICATE_WAIT_SECONDS
        pause = 0.005
        while True:
            reply = self.run_grab("queue_grab", activity_id, user_id, attempt)
            if reply.outcome == "grabbed":
                return self.record(activity_id, user_id, reply, attempt)
            if reply.outcome != "already_grabbed":
                return self.answer(reply, activity_id)
            held = held_cents(activity_id=activity_id, user_id=user_id)
            if held is not None:
                return GrabResult(Outcome.ALREADY_GRABBED, held)
            if time.monotonic() >= give_up:
                # No write came: the attempt that made the mark lost its reply (and answered
                # outcome_unknown) or died. This one writes it, fenced (adopt).
                return self.adopt(activity_id, user_id, reply, attempt)
            # The first click is still writing MySQL (or giving its packet back): back off, so
            # repeated clicks do not pile queries on the database the first one is waiting for.
            time.sleep(pause)
            pause = min(2 * pause, 0.1)
