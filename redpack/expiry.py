"""Expiry and exactly-once refund (seed 003): register at send, scan actively, refund once.

- At send, every activity enters one ZSET scored by its expiry (epoch ms), beside `expires_at`
  in MySQL (indexed with status, for the slower sweep).
- A beat task every second claims due activities in batches (a Lua script leases each one by
  pushing its score forward) and hands each to a worker task; an activity leaves the ZSET only
  after its refund committed, so a worker that dies mid-refund is retried when the lease ends.
- A slower sweep over MySQL (`status IN (open, closed) AND expires_at < now`, paged) puts back
  what the ZSET lost (a Redis restart without persistence, a send whose registration failed),
  leaving what it holds as it is (leased, postponed) unless it lies further ahead than a lease
  or a postponement can put it.
- A refund that cannot settle yet (grabs still on their way to MySQL) is put back into the ZSET
  for later, with a backoff per activity (`postpone`): the ZSET is the one schedule of retries,
  so a stuck activity holds one entry, never a growing pile of retrying tasks.
- The refund: the strategy closes atomically (after it every grab answers `closed`), waits for
  pending writes to settle, then under the activity row lock writes the one refund record
  (UNIQUE per activity), moves what was left from the escrow back to the sender's wallet (its
  journal entry UNIQUE per refund record) and moves the status closed → refunded. Running it
  twice pays once. Sharded (redpack/shards.py), the wallet is on another database: the entry
  is posted once the refund committed, and by the crediting sweep if that is cut short.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError
from django.db.models import Q
from django.utils import timezone

from strategies import registry
from strategies.base import GrabResult, Outcome
from strategies.lua import redis_client, script

from . import finished, ledger, shards
from .models import Activity, ActivityStatus, Refund
from .money import to_cents

logger = logging.getLogger(__name__)

EXPIRY_KEY = "rp:expiry"
RETRIES_KEY = "rp:expiry:retries"  # activity id -> refunds postponed so far
# A schedule entry further ahead than a lease or a backoff plus this is moved back by the sweep:
# also how far the clocks of the hosts that run beat and the workers may disagree.
SWEEP_MARGIN_SECONDS = 60.0


class NotSettled(Exception):
    """Grabs of a closed activity are still on their way to MySQL; retry the refund later."""


@dataclass(frozen=True)
class RefundOutcome:
    activity_id: int
    refunded_now: bool  # False when an earlier run already refunded
    amount_cents: int
    count: int


def _epoch_ms(expires_at: datetime) -> int:
    """An expiry as the ZSET scores it."""
    return int(expires_at.timestamp() * 1000)


def register(activities: list[Activity]) -> None:
    """Put activities into the expiry ZSET (idempotent: the score is the expiry)."""
    if activities:
        redis_client().zadd(EXPIRY_KEY, {str(a.pk): _epoch_ms(a.expires_at) for a in activities})


def claim_due(*, batch: int, lease_seconds: float, now: float | None = None) -> list[int]:
    """Lease up to `batch` due activities; `now` (epoch seconds) defaults to this clock."""
    now_ms = int((time.time() if now is None else now) * 1000)
    claimed = script("claim_due")(
        keys=[EXPIRY_KEY], args=[now_ms, int(lease_seconds * 1000), batch]
    )
    return [int(member) for member in claimed]


def postpone(activity_id: int, *, now: float | None = None) -> float:
    """Try this activity's refund again later: REDPACK_REFUND_RETRY_SECONDS, doubling with each
    postponement up to REDPACK_REFUND_RETRY_MAX_SECONDS. Returns the delay in seconds."""
    client = redis_client()
    retries = int(client.hincrby(RETRIES_KEY, str(activity_id), 1))  # type: ignore[arg-type]
    delay = min(
        settings.REDPACK_REFUND_RETRY_SECONDS * 2 ** (retries - 1),
        settings.REDPACK_REFUND_RETRY_MAX_SECONDS,
    )
    due_ms = int(((time.time() if now is None else now) + delay) * 1000)
    client.zadd(EXPIRY_KEY, {str(activity_id): due_ms})
    return delay


def refund_lag(*, now: float | None = None) -> tuple[int, float]:
    """Refunds due and not under way (no lease, no postponement running), and how many seconds
    the oldest of them is late (0 when none): two reads of the ZSET, for /metrics."""
    now_ms = int((time.time() if now is None else now) * 1000)
    client = redis_client()
    due = int(client.zcount(EXPIRY_KEY, "-inf", now_ms))  # type: ignore[arg-type]
    oldest = client.zrange(EXPIRY_KEY, 0, 0, withscores=True)
    late_ms = now_ms - oldest[0][1] if due and oldest else 0  # type: ignore[index]
    return due, max(0.0, late_ms / 1000)


def forget(activity_id: int) -> None:
    client = redis_client()
    client.zrem(EXPIRY_KEY, str(activity_id))
    client.hdel(RETRIES_KEY, str(activity_id))


def overdue_in_mysql(
    *, status: str, limit: int, now: datetime, after: tuple[datetime, int] | None = None
) -> list[tuple[datetime, int]]:
    """(expires_at, id) of the activities in `status` past expiry at `now`, in that order, the
    first `limit` after `after`: the order of the (status, expires_at) index, whose entries end
    in the id, so no sort."""
    overdue = Activity.objects.filter(status=status, expires_at__lt=now)
    if after is not None:
        overdue = overdue.filter(
            Q(expires_at__gt=after[0]) | Q(expires_at=after[0], pk__gt=after[1])
        )
    return list(overdue.order_by("expires_at", "pk").values_list("expires_at", "pk")[:limit])


def refund(*, activity_id: int, force: bool = False) -> RefundOutcome:
    """Close the activity and refund what is left, exactly once. Safe to run any number of times.

    `force` closes an activity before its expiry (the admin's "expire now").
    """
    activity = Activity.objects.get(pk=activity_id)
    if activity.status == ActivityStatus.REFUNDED:
        forget(activity_id)
        existing = Refund.objects.get(activity_id=activity_id)
        return RefundOutcome(activity_id, False, to_cents(existing.amount), existing.count)
    if not force and activity.expires_at > timezone.now():
        raise ValueError(f"activity {activity_id} has not expired yet")
    strategy = registry.get(activity.strategy)
    # Fast answers say closed from now on, and again once closed (a flag written in between
    # by a late `sold_out` never replaces closed: redpack/finished.py).
    finished.learn(activity_id, GrabResult(Outcome.CLOSED))
    closed = strategy.close(activity_id=activity_id)
    finished.learn(activity_id, GrabResult(Outcome.CLOSED))
    if not strategy.settle(activity_id=activity_id, timeout=settings.REDPACK_SETTLE_TIMEOUT):
        raise NotSettled(f"activity {activity_id}: pending grabs not yet in MySQL")
    try:
        with shards.atomic():
            activity = Activity.objects.select_for_update().get(pk=activity_id)
            if activity.status == ActivityStatus.REFUNDED:
                existing = Refund.objects.get(activity_id=activity_id)
                outcome = RefundOutcome(
                    activity_id, False, to_cents(existing.amount), existing.count
                )
            else:
                if (activity.surplus_count, to_cents(activity.surplus_amount)) != (
                    closed.remaining_count,
                    closed.remaining_cents,
                ):
                    raise NotSettled(
                        f"activity {activity_id}: MySQL holds {activity.surplus_count} packets "
                        f"worth {activity.surplus_amount}, the close reported "
                        f"{closed.remaining_count} worth {closed.remaining_cents} cents"
                    )
                refund = Refund.objects.create(
                    activity=activity, amount=activity.surplus_amount, count=activity.surplus_count
                )
                if shards.ledger_is_apart():  # sharded: once the record is in, or the sweep
                    shards.on_commit(_refund_post(refund, activity.sender_id), robust=True)
                else:
                    ledger.refund_post(refund=refund, sender_id=activity.sender_id)
                Activity.objects.filter(pk=activity_id, status=activity.status).update(
                    status=ActivityStatus.REFUNDED, surplus_count=0, surplus_amount=0
                )
                outcome = RefundOutcome(
                    activity_id, True, closed.remaining_cents, closed.remaining_count
                )
    except IntegrityError:
        # Another run wrote the refund between our read and our insert: it counts, not us.
        existing = Refund.objects.get(activity_id=activity_id)
        outcome = RefundOutcome(activity_id, False, to_cents(existing.amount), existing.count)
    forget(activity_id)
    if outcome.refunded_now:
        logger.info(
            "refund",
            extra={
                "event": "refund",
                "activity": activity_id,
                "amount_cents": outcome.amount_cents,
                "count": outcome.count,
            },
        )
    return outcome


def _refund_post(refund: Refund, sender_id: int) -> Callable[[], None]:
    def refund_post() -> None:
        ledger.refund_post(refund=refund, sender_id=sender_id)

    return refund_post


def sweep(*, page: int = 1000) -> int:
    """Put back into the ZSET every overdue activity not refunded that it lost (on every shard,
    read from MySQL `page` at a time), at its expiry. One it holds keeps its score, which a
    lease or a postponement moved past the expiry; unless the score lies further ahead than
    either can put it (a host whose clock ran ahead), when it is moved back to the expiry.
    Returns how many were put back or moved."""
    now = timezone.now()
    fixed = 0
    for _ in shards.each():
        for status in (ActivityStatus.OPEN, ActivityStatus.CLOSED):
            after = None
            while overdue := overdue_in_mysql(status=status, limit=page, now=now, after=after):
                fixed += _reschedule(overdue)
                if len(overdue) < page:
                    break
                after = overdue[-1]
    if fixed:
        logger.warning("%d overdue activities were off the expiry schedule: put back", fixed)
    return fixed


def _reschedule(overdue: list[tuple[datetime, int]]) -> int:
    """`sweep`'s work for one page: the ones the ZSET lacks added, the ones it holds further
    ahead than a lease or a postponement made now could put them (plus SWEEP_MARGIN_SECONDS)
    moved back to their expiry; how many."""
    furthest = max(settings.REDPACK_EXPIRY_LEASE_SECONDS, settings.REDPACK_REFUND_RETRY_MAX_SECONDS)
    horizon_ms = int((time.time() + furthest + SWEEP_MARGIN_SECONDS) * 1000)
    client = redis_client()
    due = {str(pk): _epoch_ms(expires) for expires, pk in overdue}
    held: list[float | None] = client.zmscore(EXPIRY_KEY, list(due))  # type: ignore[assignment]
    lost: dict[str, int] = {}
    ahead: dict[str, int] = {}
    for (member, expires_ms), score in zip(due.items(), held, strict=True):
        if score is None:
            lost[member] = expires_ms
        elif score > horizon_ms:
            ahead[member] = expires_ms
    fixed = 0
    if lost:
        fixed += int(client.zadd(EXPIRY_KEY, lost, nx=True))  # type: ignore[arg-type]
    if ahead:
        fixed += len(ahead)
        client.zadd(EXPIRY_KEY, ahead, xx=True, lt=True)  # never later than it is
    return fixed
