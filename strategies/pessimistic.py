"""SELECT … FOR UPDATE on the activity row (seed 001, 基于悲观锁).

What it locks: the activity row, for the whole grab transaction; every grab of one activity
runs in series inside MySQL. What it checks twice: nothing needs checking twice, because the
checks (open, not expired, user not in, surplus left) happen after the row lock is held.
Round trips: 4 statements in one transaction (the row lock and the user's grab read together),
no Redis. Failure mode: throughput is bounded by one hot row's lock hand-off. A process sends
one transaction of an activity at a time (its turn, turns.py), its other grabs wait in Python;
a wait longer than InnoDB's default lock wait timeout is answered `contended`.
"""

from django.db import IntegrityError

from redpack import allocation, shards
from redpack.models import Activity
from redpack.money import to_cents

from .base import CloseResult, GrabResult, GrabStrategy, Outcome
from .steps import (
    after_duplicate,
    close_row_locked,
    grab_transaction,
    read_for_grab,
    record_grab,
    refusal,
)


class PessimisticStrategy(GrabStrategy):
    name = "pessimistic"
    label = "SELECT … FOR UPDATE"
    tradeoff = "Simple and exact; every grab of an activity waits for one row lock in MySQL."

    def prepare(self, activity: Activity) -> None:
        """Nothing to prepare: the activity row is the whole state."""

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        try:
            with grab_transaction(turn=activity_id, ask_known=True):
                activity, held = read_for_grab(activity_id=activity_id, user_id=user_id)
                answer = refusal(activity, user_id=None, held=held)
                if answer is not None:
                    return answer
                cents = allocation.draw(
                    activity.allocation, to_cents(activity.surplus_amount), activity.surplus_count
                )
                record_grab(activity_id=activity_id, user_id=user_id, cents=cents)
                return GrabResult(Outcome.GRABBED, cents)
        except IntegrityError as exc:
            # UNIQUE (activity, user) caught a duplicate the row lock should already have stopped.
            return after_duplicate(activity_id=activity_id, user_id=user_id, error=exc)

    def close(self, *, activity_id: int) -> CloseResult:
        with shards.atomic():
            return close_row_locked(activity_id=activity_id)
