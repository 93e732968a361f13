"""The concurrency contract every safe strategy must pass, on real MariaDB and Redis."""

from collections import defaultdict
from decimal import Decimal

import pytest

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail
from redpack.money import to_cents
from strategies import registry
from strategies.base import Outcome

from .harness import grab_concurrently

GRABBERS = 200
PACKETS = 50


@pytest.mark.django_db(transaction=True)
def test_concurrent_double_clicks_never_oversell_or_duplicate(safe_strategy, make_users, sender):
    users = make_users(GRABBERS)
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("100.00"),
        total_count=PACKETS,
        strategy=safe_strategy,
        expires_in=3600,
    )

    answers = grab_concurrently(activity.pk, [u.pk for u in users], clicks_per_user=2)
    assert registry.get(safe_strategy).settle(activity_id=activity.pk, timeout=60)

    by_user = defaultdict(list)
    for answer in answers:
        by_user[answer.user_id].append(answer.result)
    grabbed = [
        (a.user_id, a.result.amount_cents) for a in answers if a.result.outcome is Outcome.GRABBED
    ]
    activity.refresh_from_db()
    report = audit_activity(activity, answers=grabbed)
    assert report.ok, report.violations
    assert report.oversold == 0 and report.duplicates == 0

    rows = {d.user_id: to_cents(d.amount) for d in GrabDetail.objects.filter(activity=activity)}
    assert len(grabbed) == len(rows) <= PACKETS
    for user_id, results in by_user.items():
        outcomes = [r.outcome for r in results]
        assert outcomes.count(Outcome.GRABBED) <= 1
        for result in results:
            if result.outcome is Outcome.ALREADY_GRABBED:
                assert result.amount_cents == rows[user_id]
            assert result.outcome in {
                Outcome.GRABBED,
                Outcome.ALREADY_GRABBED,
                Outcome.SOLD_OUT,
                Outcome.CONTENDED,
            }
    contended = sum(r.outcome is Outcome.CONTENDED for rs in by_user.values() for r in rs)
    if contended == 0:
        # Nobody was turned away, and there are four times more grabbers than packets.
        assert len(rows) == PACKETS
        assert Activity.objects.get(pk=activity.pk).surplus_count == 0
    assert sum(rows.values()) + to_cents(activity.surplus_amount) == 10_000


@pytest.mark.django_db(transaction=True)
def test_grabs_after_close_answer_closed(safe_strategy, make_users, sender):
    users = make_users(20)
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("10.00"),
        total_count=10,
        strategy=safe_strategy,
        expires_in=3600,
    )
    strategy = registry.get(safe_strategy)
    first = services.grab(activity_id=activity.pk, user_id=users[0].pk)
    assert first.outcome is Outcome.GRABBED
    closed = strategy.close(activity_id=activity.pk)
    assert closed.remaining_count == 9
    assert closed.remaining_cents == 1000 - first.amount_cents

    answers = grab_concurrently(activity.pk, [u.pk for u in users[1:]], clicks_per_user=1)
    assert {a.result.outcome for a in answers} == {Outcome.CLOSED}
    assert strategy.close(activity_id=activity.pk) == closed  # closing twice changes nothing
    assert strategy.settle(activity_id=activity.pk, timeout=30)
    activity.refresh_from_db()
    assert audit_activity(activity).ok
    assert GrabDetail.objects.filter(activity=activity).count() == 1
