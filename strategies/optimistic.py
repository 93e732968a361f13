"""A version column on the activity row, compare-and-set (seed 001, 基于乐观锁).

What it locks: nothing while computing. A grab reads the activity (surplus, version), draws an
amount, then writes `UPDATE … WHERE id=? AND version=? AND status='open' AND expires_at > now`
and inserts the detail in the same transaction; the row is locked only for that update.
What it checks twice: open / already grabbed / sold out on the plain read, then the conditional
update checks version, status and expiry again at the moment it writes, so a grab that read
before a close cannot land after it.
Round trips per attempt: 1 read (the activity with the user's earlier grab), then
START TRANSACTION with the UPDATE (one query), INSERT + COMMIT; a lost race retries after a
small jittered sleep, up to REDPACK_OPTIMISTIC_MAX_RETRIES times.
Failure mode: of all grabs that read one version, exactly one wins; the others retry, and each
round again lets only one through. With fewer retries than rivals, grabbers are turned away
with `contended` while packets remain (the seed's warning); the contract harness and
docs/strategies.md show how many.
"""

from django.conf import settings
from django.db import IntegrityError
from django.db.models import F

from redpack import allocation
from redpack.models import Activity, ActivityStatus
from redpack.money import to_cents

from .base import CloseResult, GrabResult, GrabStrategy, Outcome
from .retry import attempts
from .steps import after_duplicate, grab_transaction, read_for_grab, record_grab, refusal


class OptimisticStrategy(GrabStrategy):
    name = "optimistic"
    label = "version compare-and-set"
    tradeoff = "No lock held while computing; losers of a race retry, then answer contended."
    # Two attempts of one process on one version: at most one wins, so a web process lets one
    # grab of an activity try at a time (its backoff sleeps included) and sheds the others at
    # once, before they read anything (docs/benchmarks.md, "A line of one for optimistic").
    line_setting = "REDPACK_OPTIMISTIC_LINE"

    def prepare(self, activity: Activity) -> None:
        """Nothing to prepare: the activity row and its version are the whole state."""

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        for _ in attempts(settings.REDPACK_OPTIMISTIC_MAX_RETRIES):
            # The user's grab with every attempt's row: a retry follows a version that moved,
            # perhaps by a twin click's grab, and that user hears `already_grabbed`, not
            # `sold_out` (UNIQUE (activity, user) only guards the write).
            activity, held = read_for_grab(activity_id=activity_id, user_id=user_id, lock=False)
            answer = refusal(activity, user_id=None, held=held)
            if answer is not None:
                return answer
            cents = allocation.draw(
                activity.allocation, to_cents(activity.surplus_amount), activity.surplus_count
            )
            try:
                with grab_transaction():
                    if record_grab(
                        activity_id=activity_id,
                        user_id=user_id,
                        cents=cents,
                        version=activity.version,
                        open_only=True,
                    ):
                        return GrabResult(Outcome.GRABBED, cents)
            except IntegrityError as exc:
                return after_duplicate(activity_id=activity_id, user_id=user_id, error=exc)
        return GrabResult(Outcome.CONTENDED)

    def close(self, *, activity_id: int) -> CloseResult:
        """Compare-and-set the status too; every lost race means a grab landed, so it ends."""
        while True:
            activity = Activity.objects.get(pk=activity_id)
            remaining = CloseResult(activity.surplus_count, to_cents(activity.surplus_amount))
            if activity.status != ActivityStatus.OPEN:
                return remaining
            # The version alone says nothing changed since the read, status included (and
            # keeps the optimizer on the primary key, see steps.take_from_surplus).
            closed = Activity.objects.filter(pk=activity_id, version=activity.version).update(
                status=ActivityStatus.CLOSED, version=F("version") + 1
            )
            if closed:
                return remaining
