"""Celery tasks: thin, take ids, safe to run twice."""

import logging

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError

from strategies import registry

from . import bans, credit_pace, expiry, health, ledger, services, shards
from .models import Activity

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def expire_due() -> int:
    """Every second: hand each due activity (in batches) to a refund task."""
    handed = 0
    while True:
        batch = expiry.claim_due(
            batch=settings.REDPACK_EXPIRY_BATCH, lease_seconds=settings.REDPACK_EXPIRY_LEASE_SECONDS
        )
        for activity_id in batch:
            refund_activity.delay(activity_id)
        handed += len(batch)
        if len(batch) < settings.REDPACK_EXPIRY_BATCH:
            return handed


@shared_task(ignore_result=True)
def refund_activity(activity_id: int) -> None:
    """Refund once; if the activity cannot settle yet, its entry in the expiry schedule is
    pushed back (expiry.postpone) rather than this task retrying itself: one schedule, so a
    stuck activity never piles up retrying tasks."""
    try:
        services.activity_expire(activity_id=activity_id)
    except expiry.NotSettled as exc:
        delay = expiry.postpone(activity_id)
        logger.warning("%s; refund postponed by %.0f s", exc, delay)
    except Activity.DoesNotExist:
        # Deleted after the task was queued (the lab removes its scratch activities): nothing
        # is left to refund, and its schedule entry goes too.
        expiry.forget(activity_id)
        logger.warning("activity %s does not exist: nothing to refund", activity_id)


@shared_task(ignore_result=True)
def sweep_overdue() -> int:
    """Every minute: put back into the ZSET any overdue activity that Redis lost."""
    return expiry.sweep()


@shared_task(ignore_result=True)
def heartbeat() -> None:
    """From beat every REDPACK_HEARTBEAT_SECONDS: /healthz sees beat, broker and a worker alive."""
    health.record_heartbeat()


@shared_task(ignore_result=True)
def sync_disabled_users() -> int:
    """Every REDPACK_BANS_SYNC_SECONDS: the disabled users' set from MySQL (redpack/bans.py)."""
    return bans.sync()


@shared_task(
    ignore_result=True,
    autoretry_for=(DatabaseError,),
    retry_backoff=1,
    retry_jitter=True,
    max_retries=5,
    soft_time_limit=120,
    time_limit=150,
)
def credit_grabs() -> int:
    """Every REDPACK_CREDIT_INTERVAL: move each new grab's amount from its activity's escrow to
    the grabber's wallet, once (a lock wait or deadlock retries; nothing half-done survives);
    not while a burst of grabs goes on, for up to REDPACK_CREDIT_MAX_WAIT (credit_pace.py); not
    while another run goes on (one worker process credits, the others serve the rest)."""
    with credit_pace.one_run(settings.REDPACK_CREDIT_RUN_SECONDS) as alone:
        return _credit_grabs() if alone else 0


def _credit_grabs() -> int:
    pace = credit_pace.Pace()
    if pace.verdict == credit_pace.WAIT and not shards.enabled():
        return 0
    credited, finished = ledger.credit_run(
        batch=settings.REDPACK_CREDIT_BATCH,
        run_seconds=settings.REDPACK_CREDIT_RUN_SECONDS,
        stop={
            credit_pace.QUIET: pace.burst_began,
            credit_pace.WAIT: lambda: True,  # sharded: only the refunds a crash left unposted
            credit_pace.OVERDUE: None,
        }[pace.verdict],
    )
    if finished:
        pace.caught_up()
    return credited


def run_background(task: str) -> int:
    """Each distinct function the configured strategies give for this periodic task, once."""
    return sum(run() for run in registry.background_tasks(task))


# The strategies' runs stop by themselves well within these limits (REDPACK_PERSIST_RUN_SECONDS);
# a run cut short leaves its batch pending, and the reclaim run takes it over.
@shared_task(ignore_result=True, soft_time_limit=120, time_limit=150)
def persist_grabs() -> int:
    """Every REDPACK_PERSIST_INTERVAL: move new grabs of write-behind strategies to MySQL."""
    return run_background("persist")


@shared_task(ignore_result=True, soft_time_limit=120, time_limit=150)
def reclaim_grabs() -> int:
    """Every REDPACK_PERSIST_RECLAIM_INTERVAL: persist grabs a dead consumer left pending."""
    return run_background("reclaim")
