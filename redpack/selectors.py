"""Reads that need care: existence and permission checks, the one "grabbed count", and the
per-process memory of each activity's strategy."""

from datetime import datetime
from functools import lru_cache

from django.db.models import Count, QuerySet

from .errors import Forbidden, NotFound
from .models import Activity, GrabDetail, PersistFailure, Refund

MAX_ID = 2**63 - 1  # BIGINT: larger ids cannot exist, and must not reach the database driver


@lru_cache(maxsize=65536)
def activity_facts(activity_id: int) -> tuple[str, datetime]:
    """An activity's strategy and expiry never change, so each process looks them up once."""
    facts = Activity.objects.filter(pk=activity_id).values_list("strategy", "expires_at").first()
    if facts is None:
        raise NotFound(f"activity {activity_id} does not exist")
    return facts


def activity_strategy(activity_id: int) -> str:
    return activity_facts(activity_id)[0]


def activity_get(*, activity_id: int) -> Activity:
    if not 0 < activity_id <= MAX_ID:
        raise NotFound(f"activity {activity_id} does not exist")
    activity = Activity.objects.filter(pk=activity_id).select_related("refund").first()
    if activity is None:
        raise NotFound(f"activity {activity_id} does not exist")
    return activity


def activity_grabs(
    *, activity_id: int, viewer_id: int, viewer_is_staff: bool
) -> QuerySet[GrabDetail]:
    """Who grabbed what in an activity: for its sender and for staff only."""
    activity = activity_get(activity_id=activity_id)
    if activity.sender_id != viewer_id and not viewer_is_staff:
        raise Forbidden("only the sender and staff see who grabbed what")
    return (
        GrabDetail.objects.filter(activity=activity)
        .select_related("user")
        .order_by("created_at", "id")
    )


def user_grabs(*, user_id: int) -> QuerySet[GrabDetail]:
    return GrabDetail.objects.filter(user_id=user_id).order_by("-created_at", "-id")


def user_refunds(*, user_id: int) -> QuerySet[Refund]:
    return Refund.objects.filter(activity__sender_id=user_id).order_by("-created_at", "-id")


def activity_grabbed_count(activity: Activity) -> int:
    """Packets users hold: what left the surplus, less what the refund gave back (the API's
    `grabbed_count` and the admin's progress both show this)."""
    refund = getattr(activity, "refund", None)
    return activity.total_count - activity.surplus_count - (refund.count if refund else 0)


def persist_failure_counts() -> dict[str, int]:
    """Grabs that failed to persist, by status (retrying, dead: the dead letters, resolved)."""
    rows = PersistFailure.objects.values_list("status").annotate(n=Count("id")).order_by()
    return {status: n for status, n in rows}
