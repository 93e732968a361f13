"""optimistic: with few retries, grabbers are turned away while packets remain (seed 001)."""

import threading
from decimal import Decimal

import pytest
from django.test import override_settings

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity
from strategies import optimistic
from strategies.base import Outcome
from tests.contract.harness import grab_concurrently

GRABBERS = 60  # one packet each, so nobody should have to go without one


@pytest.mark.parametrize("max_retries", [0, 1])
@pytest.mark.django_db(transaction=True)
def test_few_retries_turn_grabbers_away_while_packets_remain(
    max_retries, make_users, sender, monkeypatch
):
    """Every round of attempts, each grabber still trying is held after its read of the activity
    until all of them have read it (a barrier per round, so the race happens every run): they
    all read one version, so exactly one of them wins the round and the rest retry or give up.
    With 0 and 1 retries, 59 and 58 of 60 are turned away with their packets left."""
    users = [u.pk for u in make_users(GRABBERS)]
    rounds = [threading.Barrier(GRABBERS - n, timeout=60) for n in range(max_retries + 1)]
    attempt = threading.local()
    checked = optimistic.refusal  # called right after each attempt's read of the activity

    def after_the_read(*args, **kwargs):  # type: ignore[no-untyped-def]
        made = getattr(attempt, "made", 0)
        attempt.made = made + 1
        rounds[made].wait()
        return checked(*args, **kwargs)

    monkeypatch.setattr(optimistic, "refusal", after_the_read)
    with override_settings(REDPACK_OPTIMISTIC_MAX_RETRIES=max_retries):
        activity = services.activity_send(
            sender_id=sender.pk,
            total_amount=Decimal(GRABBERS),
            total_count=GRABBERS,
            strategy="optimistic",
            expires_in=3600,
        )
        answers = grab_concurrently(activity.pk, users, clicks_per_user=1)

    grabbed = [
        (a.user_id, a.result.amount_cents) for a in answers if a.result.outcome is Outcome.GRABBED
    ]
    contended = sum(a.result.outcome is Outcome.CONTENDED for a in answers)
    assert len(grabbed) == max_retries + 1  # one winner per round
    assert contended == GRABBERS - len(grabbed)
    activity = Activity.objects.get(pk=activity.pk)
    # Exactly the packets of those turned away are still there.
    assert activity.surplus_count == contended
    assert audit_activity(activity, answers=grabbed).ok
