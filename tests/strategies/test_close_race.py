"""close() racing a burst of grabs: nothing lands after it, and it reports what is left."""

import threading
import time
from decimal import Decimal

import pytest

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail
from redpack.money import to_cents
from strategies import registry
from strategies.base import Outcome
from tests.contract.harness import Answer, grab_concurrently

MYSQL_STRATEGIES = [
    "pessimistic",
    "distributed_lock",
    "optimistic",
    "preallocated",
    "preallocated_skip_locked",
    "group_commit",  # close() racing batches, each one transaction
    "redis_queue",  # batches decided in Redis, written to MySQL before the answers
    "redis_counter",
]


@pytest.mark.parametrize("strategy", MYSQL_STRATEGIES)
@pytest.mark.django_db(transaction=True)
def test_close_in_the_middle_of_a_burst_is_atomic(strategy, make_users, sender):
    users = [u.pk for u in make_users(150)]
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("100.00"),
        total_count=100,
        strategy=strategy,
        expires_in=3600,
    )
    answers: list[Answer] = []
    burst = threading.Thread(
        target=lambda: answers.extend(grab_concurrently(activity.pk, users, clicks_per_user=1))
    )
    burst.start()
    deadline = time.monotonic() + 60
    while not GrabDetail.objects.filter(activity=activity).exists():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    closed = registry.get(strategy).close(activity_id=activity.pk)
    burst.join(timeout=300)

    activity = Activity.objects.get(pk=activity.pk)
    # A grab landing after the close would leave less than the close reported.
    assert (activity.surplus_count, to_cents(activity.surplus_amount)) == (
        closed.remaining_count,
        closed.remaining_cents,
    )
    assert activity.status == "closed"
    outcomes = {a.result.outcome for a in answers}
    assert outcomes <= {Outcome.GRABBED, Outcome.CLOSED, Outcome.CONTENDED, Outcome.SOLD_OUT}
    grabbed = [
        (a.user_id, a.result.amount_cents) for a in answers if a.result.outcome is Outcome.GRABBED
    ]
    assert len(grabbed) == 100 - closed.remaining_count
    assert registry.get(strategy).close(activity_id=activity.pk) == closed
    report = audit_activity(activity, answers=grabbed)
    assert report.ok, report.violations
    print(f"{strategy}: closed with {closed.remaining_count} left, outcomes {sorted(outcomes)}")
