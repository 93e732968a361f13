"""Reads that need care: existence and permission checks, the one "grabbed count", and the
per-process memory of each activity's strategy."""

from collections.abc import Collection
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Min, QuerySet
from django.utils import timezone

from . import shards
from .errors import Forbidden, NotFound
from .models import (
    Account,
    Activity,
    ActivityStatus,
    GrabDetail,
    JournalLine,
    PersistFailure,
    Refund,
)

MAX_ID = 2**63 - 1  # BIGINT: larger ids cannot exist, and must not reach the database driver


def possible_id(activity_id: int) -> bool:
    """Whether an activity can have this id (a path's digits may not: 0, or past BIGINT)."""
    return 0 < activity_id <= MAX_ID


def no_such_activity(activity_id: int) -> NotFound:
    """The 404 of an activity id that names none, naming `id`; the id is said back only when an
    activity could have it (a path's thousands of digits are not)."""
    if possible_id(activity_id):
        return NotFound(f"activity {activity_id} does not exist", field="id")
    return NotFound("no activity can have this id", field="id")


@lru_cache(maxsize=65536)
def activity_facts(activity_id: int) -> tuple[str, datetime]:
    """An activity's strategy and expiry never change, so each process looks them up once."""
    activities = Activity.objects.using(shards.alias_of(activity_id))
    facts = activities.filter(pk=activity_id).values_list("strategy", "expires_at").first()
    if facts is None:
        raise no_such_activity(activity_id)
    return facts


def activity_strategy(activity_id: int) -> str:
    return activity_facts(activity_id)[0]


def activity_get(*, activity_id: int) -> Activity:
    if not possible_id(activity_id):
        raise no_such_activity(activity_id)
    activities = Activity.objects.using(shards.alias_of(activity_id))
    activity = activities.filter(pk=activity_id).select_related("refund").first()
    if activity is None:
        raise no_such_activity(activity_id)
    return activity


def activity_grabs(
    *, activity_id: int, viewer_id: int, viewer_is_staff: bool, newest_first: bool = False
) -> QuerySet[GrabDetail]:
    """Who grabbed what in an activity: for its sender and for staff only."""
    activity = activity_get(activity_id=activity_id)
    if activity.sender_id != viewer_id and not viewer_is_staff:
        raise Forbidden("only the sender and staff see who grabbed what")
    order = ("-created_at", "-id") if newest_first else ("created_at", "id")
    rows = GrabDetail.objects.using(activity._state.db).filter(activity=activity).order_by(*order)
    # The users are on default while sharded: read in a second query, not joined.
    return rows.prefetch_related("user") if shards.enabled() else rows.select_related("user")


def user_grabs(*, user_id: int) -> "QuerySet[GrabDetail] | list[GrabDetail]":
    return _newest_first(GrabDetail.objects.filter(user_id=user_id))


def user_refunds(*, user_id: int) -> "QuerySet[Refund] | list[Refund]":
    return _newest_first(Refund.objects.filter(activity__sender_id=user_id))


def _newest_first(rows: QuerySet[Any]) -> "QuerySet[Any] | list[Any]":
    """Newest first; sharded, the rows of every shard merged (a list, read whole)."""
    rows = rows.order_by("-created_at", "-id")
    if not shards.enabled():
        return rows
    merged = [row for _ in shards.each() for row in rows.all()]  # a fresh query per shard
    return sorted(merged, key=lambda row: (row.created_at, row.pk), reverse=True)


class ActivityState(StrEnum):
    """What an activity is, as people say it (its `status` column only says open, closed or
    refunded, and stays open once sold out until it expires)."""

    OPEN = "open"
    SOLD_OUT = "sold out"
    EXPIRED = "expired"  # past its expiry (or expired now), the refund not yet written
    REFUNDED = "refunded"  # expired with packets left, which went back to the sender


def activity_state(activity: Activity, *, now: datetime | None = None) -> ActivityState:
    """Sold out wins: every packet was grabbed, whatever happened after (its refund is 0)."""
    refund = getattr(activity, "refund", None)
    if activity_grabbed_count(activity) == activity.total_count:
        return ActivityState.SOLD_OUT
    if refund is not None:
        return ActivityState.REFUNDED
    if activity.status != ActivityStatus.OPEN or activity.expires_at <= (now or timezone.now()):
        return ActivityState.EXPIRED
    return ActivityState.OPEN


def activity_grab_rate(*, activity_id: int) -> float | None:
    """Grabs per second from the activity's first grab to its last (None below two grabs)."""
    span = GrabDetail.objects.filter(activity_id=activity_id).aggregate(
        first=Min("created_at"), last=Max("created_at"), count=Count("id")
    )
    if span["count"] < 2:
        return None
    seconds = (span["last"] - span["first"]).total_seconds()
    return span["count"] / seconds if seconds > 0 else None


def wallet_balance(*, user_id: int) -> Decimal:
    """The user's balance (0.00 for a user whose wallet nothing has touched yet)."""
    balance = Account.objects.filter(user_id=user_id).values_list("balance", flat=True).first()
    return Decimal("0.00") if balance is None else balance


def wallet_lines(*, user_id: int) -> QuerySet[JournalLine]:
    """The user's wallet's share of each entry, newest first."""
    return (
        JournalLine.objects.filter(account__user_id=user_id).select_related("entry").order_by("-id")
    )


def activity_grabbed_count(activity: Activity) -> int:
    """Packets users hold: what left the surplus, less what the refund gave back (the API's
    `grabbed_count` and the admin's progress both show this)."""
    refund = getattr(activity, "refund", None)
    return activity.total_count - activity.surplus_count - (refund.count if refund else 0)


def activities_with_live_state(*, strategies: Collection[str]) -> QuerySet[Activity]:
    """Open activities of these strategies whose state outside MySQL should still be there: it
    lives until REDPACK_REDIS_STATE_GRACE after the expiry (uses the (status, expires_at)
    index), newest first; of the current database (shards.each() for all)."""
    grace = timedelta(seconds=settings.REDPACK_REDIS_STATE_GRACE)
    return Activity.objects.filter(
        strategy__in=strategies,
        status=ActivityStatus.OPEN,
        expires_at__gt=timezone.now() - grace,
    ).order_by("-pk")


def persist_failure_counts() -> dict[str, int]:
    """Grabs that failed to persist, by status (retrying, dead: the dead letters, resolved), on
    every shard."""
    counts: dict[str, int] = {}
    for _ in shards.each():
        rows = PersistFailure.objects.values_list("status").annotate(n=Count("id")).order_by()
        for status, n in rows:
            counts[status] = counts.get(status, 0) + n
    return counts
