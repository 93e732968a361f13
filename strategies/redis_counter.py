"""A remaining counter, a per-user lock and one Lua script (seed 000, done right).

Send: nothing is cut; rp:{id}:count holds the packets left and the meta the cents left, written
when the send commits. Grab: a read-only pre-check without any lock (lua/counter_precheck.lua:
closed or expired? counter at zero?) turns away most clicks of a popular activity; the others
take the user's lock (redis-py Lock on rp:{id}:lock:<user>) and run one EVALSHA
(lua/counter_grab.lua) that checks closed and expired, dedupes, checks the counter again, draws
the amount from what is left (the activity's allocation, in Lua, on integer cents), records
user -> amount and decrements, atomically: no window between "won" and "how much". Then one
MySQL transaction writes the detail row and decrements the surplus before the answer; if it
fails, lua/release.lua gives the amount back and removes the mark in one step, and the user may
retry.

What it locks: one user's clicks, in Redis, from the script to the end of the MySQL write. That
is the lock's job: a repeated click waits for the first one to finish, so `already_grabbed` is
answered from Redis and is always a committed grab. What it checks twice: the counter and the
status, lock-free then inside the script. Round trips: pre-check, SET NX, EVALSHA, the unlock
script, plus one MySQL transaction per winner; once sold out or closed, the pre-check alone.
"""

import logging
import secrets

from redis.exceptions import LockError

from .base import GrabResult, Outcome
from .lua import redis_client, script
from .redis_state import RedisStateStrategy
from .redis_state.keys import Keys, new_attempt, now_ms
from .steps import held_cents

logger = logging.getLogger(__name__)

LOCK_TTL_SECONDS = 10  # frees the lock of a crashed holder; far beyond one grab's MySQL write
LOCK_WAIT_SECONDS = 3  # a repeated click waits this long for the same user's first click


class RedisCounterStrategy(RedisStateStrategy):
    name = "redis_counter"
    label = "Redis counter + user lock + Lua"
    tradeoff = (
        "A lock-free counter turns away the late clicks; a per-user lock and one EVALSHA draw "
        "the amount; MySQL takes only the winners' writes."
    )

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        keys = Keys(activity_id)
        precheck = script("counter_precheck")(
            keys=keys.ordered(), args=[user_id, now_ms()]
        ).decode()
        if precheck != "go":
            return GrabResult(Outcome(precheck))
        client = redis_client()
        lock = client.lock(
            keys.lock(user_id),
            timeout=LOCK_TTL_SECONDS,
            sleep=0.02,  # each retry is a round trip; waiters are mostly the same user's 2nd click
            blocking_timeout=LOCK_WAIT_SECONDS,
        )
        if not lock.acquire():
            return GrabResult(Outcome.CONTENDED)
        attempt = new_attempt()
        try:
            reply = self.run_grab(
                "counter_grab", activity_id, user_id, attempt, secrets.randbelow(2**31)
            )
            if reply.outcome == "grabbed":
                return self.record(activity_id, user_id, reply, attempt)
            if reply.outcome != "already_grabbed":
                return self.answer(reply, activity_id)
            held = held_cents(activity_id=activity_id, user_id=user_id)
            if held is not None:
                return GrabResult(Outcome.ALREADY_GRABBED, held)
            # Held in Redis only, and this attempt holds the user's lock: the attempt that made
            # the mark is over (it answered outcome_unknown, or died), or its lock expired
            # mid-write; adopt() fences it either way.
            return self.adopt(activity_id, user_id, reply, attempt)
        finally:
            try:
                lock.release()
            except LockError:
                logger.warning(
                    "activity %s: lock of user %s expired mid-grab", activity_id, user_id
                )
