"""SQL steps the MySQL strategies share: look up a grab, record one, claim a packet, close.

Lock order. InnoDB checks a foreign key by taking a shared lock on the parent row, and the
activity's foreign keys sit on the indexes (activity_id, user_id) of the details and
(activity_id, status) of the packets: inserting a detail, or changing a packet's status, takes
a shared lock on the activity row. Two grabs that each hold it shared and then both want to
update the row deadlock. So every strategy takes the activity row exclusively (its decrement,
or SELECT … FOR UPDATE) before it inserts a detail or changes a packet's status.
"""

from decimal import Decimal

from django.db import connection
from django.db.models import F
from django.utils import timezone

from redpack import allocation
from redpack.errors import Forbidden
from redpack.models import Activity, ActivityStatus, GrabDetail, Packet, PacketStatus
from redpack.money import from_cents, minus, to_cents

from .base import CloseResult, GrabResult, Outcome


def existing_cents(*, activity_id: int, user_id: int) -> int | None:
    """What this user already grabbed from the activity, if anything."""
    amount = (
        GrabDetail.objects.filter(activity_id=activity_id, user_id=user_id)
        .values_list("amount", flat=True)
        .first()
    )
    return None if amount is None else to_cents(amount)


def already_grabbed(*, activity_id: int, user_id: int) -> GrabResult:
    """The answer once the detail insert hit a constraint: UNIQUE (activity, user) refused a
    second row for this user, or, with no row of theirs, the user itself does not exist (a
    signed token outliving its user), which is refused rather than answered as a grab."""
    cents = existing_cents(activity_id=activity_id, user_id=user_id)
    if cents is None:
        raise Forbidden(f"user {user_id} does not exist")
    return GrabResult(Outcome.ALREADY_GRABBED, cents)


def record_grab(
    *,
    activity_id: int,
    user_id: int,
    cents: int,
    version: int | None = None,
    open_only: bool = False,
    redpack_id: int | None = None,
) -> bool:
    """Take `cents` and one packet from the surplus, then insert the detail row (in that order,
    see the module docstring).

    Call it inside a transaction. The decrement is a conditional UPDATE: `version` fences it
    against any other write since the caller read the row; `open_only` refuses it once the
    activity is closed or expired. False when the condition failed and nothing was written by
    this call. IntegrityError from the insert means this user already holds a packet; the
    caller's transaction must roll back the decrement with it.
    """
    taken = _take_from_surplus(
        activity_id=activity_id, cents=cents, version=version, open_only=open_only
    )
    if not taken:
        return False
    GrabDetail.objects.create(
        activity_id=activity_id, user_id=user_id, amount=from_cents(cents), redpack_id=redpack_id
    )
    return True


def _take_from_surplus(
    *, activity_id: int, cents: int, version: int | None, open_only: bool
) -> int:
    """The conditional decrement; on MySQL by primary key, forced.

    On a small table MySQL's optimizer may run `WHERE id=? AND status='open' AND expires_at > ?`
    through the (status, expires_at) index and lock that entry before the row; close() rewrites
    the entry when it flips the status, and the two deadlock (test_close_race.py caught it).
    Django cannot hint an index, hence the raw statement. Elsewhere (the SQLite fallback) the
    ORM runs it, with money.minus keeping the DECIMAL exact.
    """
    surplus = Activity.objects.filter(pk=activity_id)
    conditions = ["id = %s"]
    params: list[Decimal | int | str | None] = [from_cents(cents), activity_id]
    if version is not None:
        surplus = surplus.filter(version=version)
        conditions.append("version = %s")
        params.append(version)
    if open_only:
        now = timezone.now()
        surplus = surplus.filter(status=ActivityStatus.OPEN, expires_at__gt=now)
        conditions.append("status = %s AND expires_at > %s")
        params += [ActivityStatus.OPEN.value, connection.ops.adapt_datetimefield_value(now)]
    if connection.vendor != "mysql":
        return surplus.update(
            surplus_count=F("surplus_count") - 1,
            surplus_amount=minus("surplus_amount", cents),
            version=F("version") + 1,
        )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Activity._meta.db_table} FORCE INDEX (PRIMARY)"
            " SET surplus_count = surplus_count - 1, surplus_amount = surplus_amount - %s,"
            f" version = version + 1 WHERE {' AND '.join(conditions)}",
            params,
        )
        return cursor.rowcount


def claim_packet(*, packet_id: int, version: int, user_id: int) -> bool:
    """Mark a pre-split packet taken if nobody claimed it since it was read at `version`.

    Call it only while holding the activity row exclusively (see the module docstring).
    """
    return bool(
        Packet.objects.filter(pk=packet_id, status=PacketStatus.AVAILABLE, version=version).update(
            status=PacketStatus.TAKEN, grabbed_by_id=user_id, version=F("version") + 1
        )
    )


def close_row_locked(*, activity_id: int) -> CloseResult:
    """Close under the activity's row lock; idempotent. Call it inside a transaction.

    A grab that already decremented holds the row lock until it commits, so the remainder read
    here includes it; a grab that has not yet decremented waits for this one to commit and then
    finds the activity closed (or its version moved).
    """
    activity = Activity.objects.select_for_update().get(pk=activity_id)
    if activity.status == ActivityStatus.OPEN:
        Activity.objects.filter(pk=activity_id).update(
            status=ActivityStatus.CLOSED, version=F("version") + 1
        )
    return CloseResult(activity.surplus_count, to_cents(activity.surplus_amount))


def split_into_packets(activity: Activity) -> None:
    """Cut the activity into its packets at send time (t_redpack), for pre-allocating strategies."""
    amounts = allocation.split(
        activity.allocation, to_cents(activity.total_amount), activity.total_count
    )
    Packet.objects.bulk_create(
        [Packet(activity=activity, amount=from_cents(cents)) for cents in amounts],
        batch_size=1000,
    )
