"""Business rules: send, grab, and the reads that need care."""

import logging
from datetime import timedelta
from decimal import Decimal
from functools import lru_cache

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from strategies import registry
from strategies.base import GrabResult, Outcome

from . import allocation, expiry
from .errors import Forbidden, InvalidInput, NotFound, RedpackError
from .models import Activity, GrabDetail, Refund
from .money import from_cents, to_cents

logger = logging.getLogger(__name__)

# MySQL/MariaDB: ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK, ER_LOCK_NOWAIT.
LOCK_TIMEOUT_ERRNOS = frozenset({1205, 1213, 3572})
MAX_ID = 2**63 - 1  # BIGINT: larger ids cannot exist, and must not reach the database driver


def activity_send_validate(
    *,
    total_amount: Decimal,
    total_count: int,
    strategy: str,
    allocation_kind: str,
    expires_in: int,
) -> int:
    """Check a send request against the rules; return the total in cents or raise InvalidInput."""
    if strategy not in registry.names():
        raise InvalidInput(f"unknown strategy {strategy!r}", field="strategy")
    if not registry.allowed(strategy):
        reason = registry.unavailable_reason(strategy)
        raise InvalidInput(f"strategy {strategy!r} is not available: {reason}", field="strategy")
    if allocation_kind not in {kind.value for kind in allocation.Allocation}:
        raise InvalidInput(f"unknown allocation {allocation_kind!r}", field="allocation")
    try:
        total_cents = to_cents(total_amount)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="total_amount") from exc
    if total_cents > to_cents(settings.REDPACK_MAX_TOTAL_AMOUNT):
        raise InvalidInput(
            f"total_amount exceeds the maximum of {settings.REDPACK_MAX_TOTAL_AMOUNT}",
            field="total_amount",
        )
    if total_cents > total_count * to_cents(settings.REDPACK_MAX_PACKET_AMOUNT):
        raise InvalidInput(
            f"the average packet may not exceed {settings.REDPACK_MAX_PACKET_AMOUNT}",
            field="total_amount",
        )
    if not 1 <= total_count <= settings.REDPACK_MAX_COUNT:
        raise InvalidInput(
            f"total_count must be between 1 and {settings.REDPACK_MAX_COUNT}", field="total_count"
        )
    try:
        allocation.validate(total_cents, total_count)
    except allocation.AllocationError as exc:
        raise InvalidInput(str(exc), field="total_amount") from exc
    if not settings.REDPACK_MIN_EXPIRES_IN <= expires_in <= settings.REDPACK_MAX_EXPIRES_IN:
        raise InvalidInput(
            f"expires_in must be between {settings.REDPACK_MIN_EXPIRES_IN} and "
            f"{settings.REDPACK_MAX_EXPIRES_IN} seconds",
            field="expires_in",
        )
    return total_cents


def activity_send(
    *,
    sender_id: int,
    total_amount: Decimal,
    total_count: int,
    strategy: str,
    allocation_kind: str = allocation.Allocation.DOUBLE_AVERAGE,
    expires_in: int = 86400,
) -> Activity:
    """Create an activity and let its strategy prepare (pre-split packets, Redis state)."""
    total_cents = activity_send_validate(
        total_amount=total_amount,
        total_count=total_count,
        strategy=strategy,
        allocation_kind=allocation_kind,
        expires_in=expires_in,
    )
    with transaction.atomic():
        activity = Activity.objects.create(
            sender_id=sender_id,
            total_amount=from_cents(total_cents),
            surplus_amount=from_cents(total_cents),
            total_count=total_count,
            surplus_count=total_count,
            strategy=strategy,
            allocation=allocation_kind,
            expires_at=timezone.now() + timedelta(seconds=expires_in),
        )
        registry.get(strategy).prepare(activity)
        transaction.on_commit(lambda: expiry.register([activity]))
    logger.info(
        "activity sent",
        extra={
            "event": "activity_sent",
            "activity": activity.pk,
            "strategy": strategy,
            "count": total_count,
        },
    )
    return activity


@lru_cache(maxsize=65536)
def _strategy_of(activity_id: int) -> str:
    """An activity's strategy never changes, so each process looks it up once."""
    name = Activity.objects.filter(pk=activity_id).values_list("strategy", flat=True).first()
    if name is None:
        raise NotFound(f"activity {activity_id} does not exist")
    return name


def grab(*, activity_id: int, user_id: int) -> GrabResult:
    if not 0 < activity_id <= MAX_ID:
        raise NotFound(f"activity {activity_id} does not exist")
    strategy = registry.get(_strategy_of(activity_id))
    ids = {"activity": activity_id, "user": user_id}
    try:
        result = strategy.grab(activity_id=activity_id, user_id=user_id)
    except RedpackError:
        raise  # an expected failure, answered with its own code
    except Exception as exc:
        if isinstance(exc, DatabaseError) and is_lock_timeout(exc):
            # The strategy's transaction was rolled back (and its Redis state given back), so
            # nothing was granted: the honest answer is "try again", not a server error.
            logger.warning(
                "grab lock timeout", extra={"event": "lock_timeout", "error": exc, **ids}
            )
            return GrabResult(Outcome.CONTENDED)
        logger.exception("grab failed", extra={"event": "grab_failed", **ids})
        raise
    if result.outcome is Outcome.CONTENDED:
        logger.info("grab contended", extra={"event": "grab_contended", **ids})
    return result


def is_lock_timeout(exc: DatabaseError) -> bool:
    """A lock wait that gave up: InnoDB's lock wait timeout or deadlock, SQLite's busy timeout."""
    code = exc.args[0] if exc.args else None
    return code in LOCK_TIMEOUT_ERRNOS or "database is locked" in str(exc)


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
