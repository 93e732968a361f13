"""Expiry and exactly-once refund, for every safe strategy, on real MariaDB, Redis and Celery."""

import logging
import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from redpack import expiry, services, tasks
from redpack.audit import audit_activity
from redpack.models import Activity, ActivityStatus, GrabDetail, Refund
from redpack.money import to_cents
from strategies import registry
from strategies.base import Outcome
from strategies.lua import redis_client

from .dummy_strategies import DUMMIES
from .servers import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)


def send(sender, strategy: str, count: int = 20, expires_in: int = 3600) -> Activity:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("20.00"),
        total_count=count,
        strategy=strategy,
        expires_in=expires_in,
    )


def wait_until_expired(activity: Activity) -> None:
    """Until the wall clock has passed the activity's expiry (a refund refuses it before)."""
    expires = Activity.objects.get(pk=activity.pk).expires_at.timestamp()
    while expires > time.time():
        time.sleep(0.05)


def assert_refunded_once(activity_id: int) -> Refund:
    activity = Activity.objects.get(pk=activity_id)
    assert activity.status == ActivityStatus.REFUNDED
    refund = Refund.objects.get(activity_id=activity_id)
    grabbed = GrabDetail.objects.filter(activity_id=activity_id)
    assert grabbed.count() + refund.count == activity.total_count
    cents = sum(to_cents(d.amount) for d in grabbed) + to_cents(refund.amount)
    assert cents == to_cents(activity.total_amount)
    report = audit_activity(activity)
    assert report.ok, report.violations
    return refund


def test_grabs_racing_the_expiry(safe_strategy, sender, make_users):
    users = make_users(80)
    activity = send(sender, safe_strategy, count=60, expires_in=2)
    stop = threading.Event()
    answers: list[tuple[int, Outcome]] = []
    lock = threading.Lock()

    def grabber(user_id: int) -> None:
        try:
            while not stop.is_set():
                result = services.activity_grab(activity_id=activity.pk, user_id=user_id)
                with lock:
                    answers.append((user_id, result.outcome))
                if result.outcome in {Outcome.CLOSED, Outcome.SOLD_OUT}:
                    return
                time.sleep(0.05)
        finally:
            connection.close()

    threads = [threading.Thread(target=grabber, args=(u.pk,)) for u in users]
    for thread in threads:
        thread.start()
    wait_until_expired(activity)
    outcome = expiry.refund(activity_id=activity.pk)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    refund = assert_refunded_once(activity.pk)
    assert outcome.refunded_now and outcome.count == refund.count
    late = services.activity_grab(activity_id=activity.pk, user_id=users[-1].pk)
    assert late.outcome in {Outcome.CLOSED, Outcome.ALREADY_GRABBED}
    if late.outcome is Outcome.ALREADY_GRABBED:  # the refund closed it: no new grab since
        assert GrabDetail.objects.filter(activity=activity, user=users[-1]).exists()


def test_refund_runs_twice_concurrently_but_pays_once(safe_strategy, sender, make_users):
    users = make_users(4)  # before the send: the four grabs must all come before the expiry
    activity = send(sender, safe_strategy, count=10, expires_in=2)
    for user in users:
        grab = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
        assert grab.outcome is Outcome.GRABBED, grab
    wait_until_expired(activity)
    results = []

    def run() -> None:
        try:
            results.append(expiry.refund(activity_id=activity.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sum(r.refunded_now for r in results) == 1
    assert {(r.amount_cents, r.count) for r in results} == {(results[0].amount_cents, 6)}
    refund = assert_refunded_once(activity.pk)
    assert refund.count == 6


def test_scanners_racing_each_other_refund_each_activity_once(sender):
    activities = [send(sender, "pessimistic", count=3, expires_in=1) for _ in range(30)]
    time.sleep(1.1)
    claimed: list[int] = []
    lock = threading.Lock()

    def scanner() -> None:
        try:
            while batch := expiry.claim_due(batch=7, lease_seconds=60):
                with lock:
                    claimed.extend(batch)
                for activity_id in batch:
                    expiry.refund(activity_id=activity_id)
        finally:
            connection.close()

    threads = [threading.Thread(target=scanner) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(claimed) == sorted(a.pk for a in activities)  # each claimed by one scanner
    for activity in activities:
        assert_refunded_once(activity.pk)
    assert Refund.objects.count() == 30


def test_a_worker_dying_after_close_is_retried_when_its_lease_ends(safe_strategy, sender):
    activity = send(sender, safe_strategy, count=5, expires_in=1)
    due = activity.expires_at.timestamp()
    assert expiry.claim_due(batch=10, lease_seconds=30, now=due) == [activity.pk]
    registry.get(safe_strategy).close(activity_id=activity.pk)  # ...and the worker dies here
    assert not Refund.objects.filter(activity=activity).exists()
    assert expiry.claim_due(batch=10, lease_seconds=60, now=due + 29) == []  # still leased
    assert expiry.claim_due(batch=10, lease_seconds=60, now=due + 30) == [activity.pk]
    time.sleep(max(0.0, due - time.time()))  # a refund needs the activity really expired
    expiry.refund(activity_id=activity.pk)
    assert assert_refunded_once(activity.pk).count == 5
    assert expiry.claim_due(batch=10, lease_seconds=60, now=due + 3600) == []


def test_sweep_finds_what_redis_lost(sender):
    activity = send(sender, "pessimistic", count=5, expires_in=1)
    expiry.forget(activity.pk)  # as if Redis restarted without persistence
    time.sleep(1.1)
    assert expiry.claim_due(batch=10, lease_seconds=60) == []
    assert expiry.sweep() == 1
    assert expiry.claim_due(batch=10, lease_seconds=60) == [activity.pk]


def schedule() -> dict[bytes, float]:
    return dict(redis_client().zrange(expiry.EXPIRY_KEY, 0, -1, withscores=True))


def test_the_sweep_puts_back_every_lost_activity_and_moves_no_other(sender):
    """Seven overdue activities, three sharing an expiry across a page's end: two the ZSET lost
    (one of the three among them), one whose refund was postponed, one leased to a worker, one
    scheduled an hour ahead (a clock that ran ahead), two as registered; and one refunded. A
    sweep reading MySQL two at a time puts both lost ones back at their expiry and the one an
    hour ahead too, and leaves the others' scores as they were: a postponed refund keeps its
    backoff, a leased one is not handed to a second worker."""
    activities = [send(sender, "pessimistic", count=3) for _ in range(8)]
    past = timezone.now() - timedelta(minutes=10)
    offsets = [0, 1, 1, 1, 2, 3, 4, 5]  # seconds after `past`: 1, 2 and 3 share theirs
    for activity, offset in zip(activities, offsets, strict=True):
        Activity.objects.filter(pk=activity.pk).update(expires_at=past + timedelta(seconds=offset))
    overdue = list(Activity.objects.filter(pk__in=[a.pk for a in activities]).order_by("pk"))
    expiry.register(overdue)
    Activity.objects.filter(pk=overdue[7].pk).update(status=ActivityStatus.REFUNDED)
    expiry.forget(overdue[7].pk)
    lost = [overdue[2], overdue[5]]  # the 2nd of three equal expiries, on the 2nd page
    for activity in lost:
        expiry.forget(activity.pk)
    expiry.postpone(overdue[3].pk)
    lease = settings.REDPACK_EXPIRY_LEASE_SECONDS  # as the worker leases (tasks.py)
    assert expiry.claim_due(batch=1, lease_seconds=lease) == [overdue[0].pk]
    ahead = overdue[4]
    redis_client().zadd(expiry.EXPIRY_KEY, {str(ahead.pk): (time.time() + 3600) * 1000})
    before = schedule()
    assert expiry.sweep(page=2) == 3
    at_expiry = {str(a.pk).encode(): a.expires_at.timestamp() * 1000 // 1 for a in [*lost, ahead]}
    assert schedule() == {**before, **at_expiry}
    assert expiry.sweep(page=2) == 0


def test_refund_before_expiry_needs_force(sender, make_users):
    activity = send(sender, "pessimistic", count=5)
    with pytest.raises(ValueError, match="not expired"):
        expiry.refund(activity_id=activity.pk)
    expiry.refund(activity_id=activity.pk, force=True)
    assert_refunded_once(activity.pk)
    late = services.activity_grab(activity_id=activity.pk, user_id=make_users(1)[0].pk)
    assert late.outcome is Outcome.CLOSED


def test_celery_worker_and_beat_refund_expired_activities(sender, make_users, tmp_path):
    """The real processes: `celery -A redpack worker -B` picks expired activities up."""
    (grabber,) = make_users(1)
    activities = [send(sender, "pessimistic", count=4, expires_in=2) for _ in range(5)]
    # The last one sent, at once: a grab that came after its expiry would be answered closed.
    grab = services.activity_grab(activity_id=activities[-1].pk, user_id=grabber.pk)
    assert grab.outcome is Outcome.GRABBED, grab
    with celery_worker(tmp_path / "beat-schedule"):
        deadline = time.monotonic() + 60
        while Refund.objects.count() < 5 and time.monotonic() < deadline:
            time.sleep(0.5)
    for activity in activities:
        assert_refunded_once(activity.pk)
    assert Refund.objects.get(activity=activities[-1]).count == 3


def test_bench_expiry_command_refunds_everything_once():
    import io
    import json

    from django.core.management import call_command

    out = io.StringIO()
    call_command(
        "bench_expiry",
        "--activities",
        "40",
        "--workers",
        "3",
        "--grabbers",
        "2",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue())
    assert result["refund_records"] == 40 and result["audit_ok"] is True
    assert Refund.objects.count() == 40


def test_a_refund_that_cannot_settle_is_postponed_not_piled_up(sender, settings):
    """One entry in the expiry schedule per activity, pushed back further each time."""
    settings.REDPACK_STRATEGIES = {**settings.REDPACK_STRATEGIES, **DUMMIES}
    activity = send(sender, "unsettled")
    Activity.objects.filter(pk=activity.pk).update(expires_at=timezone.now() - timedelta(1))
    before = time.time()
    for _ in range(3):
        tasks.refund_activity(activity.pk)
    after = time.time()
    redis = redis_client()
    assert redis.zcard(expiry.EXPIRY_KEY) == 1
    assert int(redis.hget(expiry.RETRIES_KEY, str(activity.pk))) == 3
    delay = 4 * settings.REDPACK_REFUND_RETRY_SECONDS  # the third: doubled twice
    score = redis.zscore(expiry.EXPIRY_KEY, str(activity.pk))
    assert (before + delay) * 1000 <= score <= (after + delay) * 1000 + 1
    assert not Refund.objects.filter(activity=activity).exists()


def test_a_refund_task_of_a_deleted_activity_ends_quietly(sender, caplog):
    """A refund queued for an activity deleted since (the lab removes its scratch ones) has
    nothing to refund: the task ends without an error and the schedule forgets the id."""
    gone = send(sender, "pessimistic").pk + 1000  # never sent, as if deleted
    redis = redis_client()
    redis.zadd(expiry.EXPIRY_KEY, {str(gone): 0})
    with caplog.at_level(logging.WARNING, logger="redpack.tasks"):
        tasks.refund_activity(gone)
    assert redis.zscore(expiry.EXPIRY_KEY, str(gone)) is None
    assert any("nothing to refund" in r.getMessage() for r in caplog.records)
    assert not Refund.objects.filter(activity_id=gone).exists()
