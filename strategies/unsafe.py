"""No lock at all: read, compute, write back (seed 000's 无锁方案, the baseline that oversells).

What it locks: nothing. A grab reads the surplus, draws an amount, inserts the detail and
writes the surplus back as absolute values (`SET surplus_count = <read − 1>`), each statement
committed on its own.
What it checks twice: nothing. Open, not expired, not yet grabbed and surplus left are checked
once on a read that may be stale by the time of the write; a close can be overwritten too.
Round trips: 2 reads, INSERT, UPDATE; the fastest strategy, and wrong.
Failure mode: two grabs that read the same surplus both write `surplus − 1`, so one decrement
is lost (the auditor reports it as `oversold`: grabbed + surplus > total), and more packets can
be handed out than exist. UNIQUE (activity, user) still stops a second row per user. It exists
to show the auditor catches this; it is refused unless REDPACK_ALLOW_UNSAFE_STRATEGIES is on.
"""

from django.db import IntegrityError
from django.db.models import F

from redpack import allocation
from redpack.models import Activity, ActivityStatus, GrabDetail
from redpack.money import from_cents, to_cents

from .base import CloseResult, GrabResult, GrabStrategy, Outcome
from .steps import after_duplicate, refusal


class UnsafeStrategy(GrabStrategy):
    name = "unsafe"
    label = "no lock (oversells)"
    tradeoff = "Baseline only: read-modify-write without a lock loses updates and oversells."
    safe = False

    def prepare(self, activity: Activity) -> None:
        """Nothing to prepare: the activity row is the whole state."""

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        activity = Activity.objects.get(pk=activity_id)
        answer = refusal(activity, user_id=user_id)
        if answer is not None:
            return answer
        surplus_cents = to_cents(activity.surplus_amount)
        cents = allocation.draw(activity.allocation, surplus_cents, activity.surplus_count)
        try:
            GrabDetail.objects.create(
                activity_id=activity_id, user_id=user_id, amount=from_cents(cents)
            )
        except IntegrityError as exc:
            return after_duplicate(activity_id=activity_id, user_id=user_id, error=exc)
        Activity.objects.filter(pk=activity_id).update(
            surplus_count=activity.surplus_count - 1,
            surplus_amount=from_cents(surplus_cents - cents),
            version=activity.version + 1,
        )
        return GrabResult(Outcome.GRABBED, cents)

    def close(self, *, activity_id: int) -> CloseResult:
        activity = Activity.objects.get(pk=activity_id)
        Activity.objects.filter(pk=activity_id, status=ActivityStatus.OPEN).update(
            status=ActivityStatus.CLOSED, version=F("version") + 1
        )
        return CloseResult(activity.surplus_count, to_cents(activity.surplus_amount))
