"""Celery tasks: thin, take ids, safe to run twice."""

from celery import shared_task
from django.conf import settings

from . import expiry, health


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


@shared_task(
    ignore_result=True,
    autoretry_for=(expiry.NotSettled,),
    retry_backoff=True,
    max_retries=20,
)
def refund_activity(activity_id: int) -> None:
    expiry.refund(activity_id=activity_id)


@shared_task(ignore_result=True)
def sweep_overdue() -> int:
    """Every minute: put back into the ZSET any overdue activity that Redis lost."""
    return expiry.sweep()


@shared_task(ignore_result=True)
def heartbeat() -> None:
    """From beat every REDPACK_HEARTBEAT_SECONDS: /healthz sees beat, broker and a worker alive."""
    health.record_heartbeat()
