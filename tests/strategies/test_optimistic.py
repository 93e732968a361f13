"""optimistic: with few retries, grabbers are turned away while packets remain (seed 001)."""

from decimal import Decimal

import pytest
from django.test import override_settings

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity
from strategies.base import Outcome
from tests.contract.harness import grab_concurrently

GRABBERS = 60  # one packet each, so nobody should have to go without one
BURSTS = 3  # a burst the scheduler happened to serialise proves nothing: try again, bounded


@pytest.mark.parametrize("max_retries", [0, 1])
@pytest.mark.django_db(transaction=True)
def test_few_retries_turn_grabbers_away_while_packets_remain(
    max_retries, make_users, sender, record_property
):
    users = [u.pk for u in make_users(GRABBERS)]
    with override_settings(REDPACK_OPTIMISTIC_MAX_RETRIES=max_retries):
        for _ in range(BURSTS):
            activity = services.activity_send(
                sender_id=sender.pk,
                total_amount=Decimal(GRABBERS),
                total_count=GRABBERS,
                strategy="optimistic",
                expires_in=3600,
            )
            answers = grab_concurrently(activity.pk, users, clicks_per_user=1)
            contended = sum(a.result.outcome is Outcome.CONTENDED for a in answers)
            if contended:
                break

    grabbed = [
        (a.user_id, a.result.amount_cents) for a in answers if a.result.outcome is Outcome.GRABBED
    ]
    assert contended > 0
    assert len(grabbed) + contended == GRABBERS
    activity = Activity.objects.get(pk=activity.pk)
    # Exactly the packets of those turned away are still there.
    assert activity.surplus_count == contended
    assert audit_activity(activity, answers=grabbed).ok
    record_property("contended_share", round(contended / GRABBERS, 3))
    print(f"max_retries={max_retries}: {contended}/{GRABBERS} turned away with packets left")
