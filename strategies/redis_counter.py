"""A remaining counter and one Lua script that draws the amount (seed 000, done right).

Send: nothing is cut; rp:{id}:count holds the packets left and the meta the cents left, written
when the send commits. Grab: concurrent grabs of the activity in this process join a batch
(strategies/combiner.py); one EVALSHA (lua/grab.lua, drawing) checks closed and expired, dedupes,
checks the counter, draws each winner's amount from what is left (the activity's allocation, in
Lua, on integer cents), records user -> amount and decrements, atomically: no window between
"won" and "how much". Then one MySQL transaction (group commit) writes the winners' detail rows
and decrements the surplus before they are answered; a grab that could not be written gives its
amount back and removes its mark (lua/release.lua), and the user may retry.

The seed's per-user lock is gone: the user's mark in Redis does its job. A repeated click that
finds it answers `already_grabbed` once MySQL holds the first click's row, waiting while that
write is in flight; a mark no write follows is taken over (adopt), as in redis_queue. What it
locks: nothing in Redis; in MySQL, each batch's transaction ends on the hot activity row. Round
trips: one EVALSHA and at most one MySQL transaction per batch; once sold out or closed, the
script alone.
"""

import secrets

from .redis_state import RedisStateStrategy


class RedisCounterStrategy(RedisStateStrategy):
    name = "redis_counter"
    label = "Redis counter + Lua draw, batched"
    tradeoff = (
        "Nothing is cut at send; one EVALSHA draws the amounts for a batch of concurrent grabs "
        "and one MySQL transaction writes the batch's winners."
    )
    takes = "draw"

    def script_args(self) -> tuple[str, int]:
        return (self.takes, secrets.randbelow(2**31))  # a fresh seed for the draw (lua/grab.lua)
