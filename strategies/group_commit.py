"""Group commit: concurrent grabs of an activity share one MySQL transaction.

The seeds lock the hot activity row once per grab: each grab's transaction holds it for four
round trips, and grabs of one activity run in series at the rate of that hand-off. Here the
grabs that arrive in one process while a batch runs join the next batch (strategies/combiner.py:
a lone grab runs at once, as a batch of one), and one transaction serves the batch:

1. SELECT … FOR UPDATE on the activity row (status, expiry, what is left), with which of the
   batch's users already hold a packet as a subquery of the same statement (one round trip);
2. the amounts, drawn in order with allocation.draw; once nothing is left, the rest `sold_out`;
   the same user twice in the batch: one packet, the later click `already_grabbed`;
3. one UPDATE of the surplus, one multi-row INSERT of the grab rows and COMMIT, sent as one
   query (steps.GrabTransaction.commit_with_grabs: one round trip).

A web request's own checks (its user's ban and throttle) are made for the whole batch in one
Redis script run before the lookup (`checked_batch`, strategies/request_checks.py), instead of
one round trip per request before it; a refused member takes no part in the transaction.

What it locks: the activity row, once per batch, for two round trips (the row with the lookup;
the writes with the COMMIT). Every check is made under the row lock, which every
writer of the activity's grabs takes first; UNIQUE (activity, user) stays the last line.

Failure: one transaction, so after a failure during the writes (a dropped connection, maybe
during COMMIT) either every row of the batch exists or none does; MySQL is asked which on a
fresh connection behind the row lock before anybody is answered, by the rows' own created_at
(steps.GrabTransaction.written: a member's other click may have written that member's grab
since), and when it cannot be asked, the members who were to get a packet get OutcomeUnknown
(503, retry).
A batch that wrote nothing keeps its answers whatever its COMMIT's fate
(steps.GrabTransaction.commit). A grab row refused by a constraint (a user that does not exist)
fails the batch's INSERT: each member is then run again on its own, so only that member gets
its 403.
"""

from collections.abc import Hashable, Sequence
from functools import cached_property

from django.conf import settings
from django.db import DatabaseError, IntegrityError

from redpack import allocation, shards
from redpack.errors import OutcomeUnknown
from redpack.hotsettings import hot
from redpack.models import Activity
from redpack.money import to_cents
from redpack.shards import connection

from .base import CloseResult, GrabResult, GrabStrategy, Outcome, RequestChecks
from .combiner import Combiner
from .request_checks import check_all, checks_arg
from .steps import (
    GrabRow,
    GrabTransaction,
    after_duplicate,
    close_row_locked,
    grab_transaction,
    read_for_batch,
    refusal,
)


class GroupCommitStrategy(GrabStrategy):
    name = "group_commit"
    label = "Group commit (one transaction per batch)"
    tradeoff = (
        "MySQL only and exact; concurrent grabs share one transaction, so the hot row is "
        "locked once per batch instead of once per grab."
    )
    batched = True

    @cached_property
    def combiner(self) -> Combiner[tuple[int, str], GrabResult]:
        return Combiner(
            self.checked_batch,
            cap=lambda: hot.REDPACK_BATCH_MAX,
            gather=lambda: hot.REDPACK_BATCH_GATHER,
        )

    def prepare(self, activity: Activity) -> None:
        """Nothing to prepare: the activity row is the whole state."""

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        return self.combiner.submit(activity_id, (user_id, ""))

    def carries_checks(self) -> bool:
        """The batch's requests are checked together, in one round trip (checked_batch)."""
        return bool(settings.REDPACK_GRAB_CHECKS_IN_SCRIPT)

    def grab_checked(self, *, activity_id: int, user_id: int, checks: RequestChecks) -> GrabResult:
        return self.combiner.submit(activity_id, (user_id, checks_arg(checks)))

    def checked_batch(
        self, activity_id: Hashable, members: list[tuple[int, str]]
    ) -> Sequence[GrabResult | Exception]:
        """The members' request checks in one script run (request_checks.check_all: those
        refused, or not checked, take nothing), then one transaction for the others."""
        stopped = check_all(members)
        going = [user_id for (user_id, _), stop in zip(members, stopped, strict=True) if not stop]
        try:
            answers = iter(self.grab_batch(activity_id, going) if going else [])
        except Exception as exc:  # noqa: BLE001 - theirs; a refused member keeps its refusal
            answers = iter([exc] * len(going))
        return [stop or next(answers) for stop in stopped]

    def close(self, *, activity_id: int) -> CloseResult:
        with shards.atomic():
            return close_row_locked(activity_id=activity_id)

    def grab_batch(
        self, activity_id: Hashable, user_ids: list[int]
    ) -> Sequence[GrabResult | Exception]:
        """One transaction for the batch; one answer per member, in order."""
        assert isinstance(activity_id, int)
        planned: list[GrabResult] = []
        rows: list[GrabRow] = []
        transaction: GrabTransaction | None = None
        try:
            with grab_transaction() as transaction:
                planned, rows = self.plan(activity_id, user_ids)
                if rows:
                    transaction.commit_with_grabs(
                        activity_id=activity_id, rows=rows, row_locked=True
                    )
        except IntegrityError as exc:
            # The members' grabs were looked up under the row lock, which every writer of this
            # activity's grabs holds: a member MySQL refuses is one that does not exist (a
            # signed token outliving its user), or, alone, whatever after_duplicate finds.
            if len(user_ids) > 1:
                return [self.alone(activity_id, user_id) for user_id in user_ids]
            try:
                return [after_duplicate(activity_id=activity_id, user_id=user_ids[0], error=exc)]
            except Exception as refused:  # noqa: BLE001 - this member's answer (403)
                return [refused]
        except DatabaseError:
            if not rows:
                # Nothing was being written (e.g. a lock wait timeout on the row): every member
                # gets the error, and services answers a lock timeout `contended`.
                raise
            return self.settle_in_doubt(activity_id, user_ids, planned, rows, transaction)
        return planned

    def plan(self, activity_id: int, user_ids: list[int]) -> tuple[list[GrabResult], list[GrabRow]]:
        """Under the activity's row lock, read with the members' grabs in one statement
        (steps.read_for_batch): every member's answer and the rows to write."""
        activity, holding = read_for_batch(activity_id=activity_id, user_ids=user_ids)
        refused = refusal(activity, user_id=None)
        if refused is not None and refused.outcome is Outcome.CLOSED:
            return [refused] * len(user_ids), []
        left_cents, left_count = to_cents(activity.surplus_amount), activity.surplus_count
        planned: list[GrabResult] = []
        rows: list[GrabRow] = []
        for user_id in user_ids:
            if user_id in holding:
                planned.append(GrabResult(Outcome.ALREADY_GRABBED, holding[user_id]))
            elif left_count <= 0:
                planned.append(GrabResult(Outcome.SOLD_OUT))
            else:
                cents = allocation.draw(activity.allocation, left_cents, left_count)
                left_cents, left_count = left_cents - cents, left_count - 1
                holding[user_id] = cents
                rows.append(GrabRow(user_id, cents))
                planned.append(GrabResult(Outcome.GRABBED, cents))
        return planned, rows

    def alone(self, activity_id: int, user_id: int) -> GrabResult | Exception:
        """A member run again in a batch of its own (its batch's INSERT was refused)."""
        connection.close_if_unusable_or_obsolete()
        try:
            (answer,) = self.grab_batch(activity_id, [user_id])
        except Exception as exc:  # noqa: BLE001 - this member's answer, not the others'
            return exc
        return answer

    def settle_in_doubt(
        self,
        activity_id: int,
        user_ids: list[int],
        planned: list[GrabResult],
        rows: list[GrabRow],
        transaction: GrabTransaction | None,
    ) -> list[GrabResult | Exception]:
        """The transaction failed while writing: rolled back, or, if the connection dropped
        during COMMIT, maybe committed, and then wholly. MySQL says which, by the rows stamped
        with the batch's INSERT (GrabTransaction.written; None: no transaction was opened);
        the answers that needed no write stand either way (a `sold_out` needed it: the
        rows that were not written would have taken the last packets)."""
        batch_users = {row.user_id for row in rows}
        # A `sold_out` depends on the write too: the batch's own rows took the last packets.
        depends = [
            answer.outcome is Outcome.SOLD_OUT
            or (
                answer.outcome in {Outcome.GRABBED, Outcome.ALREADY_GRABBED}
                and user_id in batch_users
            )
            for user_id, answer in zip(user_ids, planned, strict=True)
        ]
        try:
            written = transaction is not None and transaction.written()
        except OutcomeUnknown as unknown:
            return [unknown if d else a for d, a in zip(depends, planned, strict=True)]
        if written:
            return list(planned)
        # Proven not written: nothing was granted, the honest answer is "try again".
        contended = GrabResult(Outcome.CONTENDED)
        return [contended if d else a for d, a in zip(depends, planned, strict=True)]
