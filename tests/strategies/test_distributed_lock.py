"""distributed_lock: a bounded wait answers `contended`; an expired lock cannot let a write in."""

import threading
import time
from collections.abc import Callable
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test import override_settings
from django_redis import get_redis_connection

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail
from strategies import turns
from strategies.base import GrabResult, Outcome
from strategies.distributed_lock import LOCK_POLL_SECONDS, activity_lock, lock_key


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        # Slower than InnoDB's information_schema cache, which refreshes only when it has not
        # been read for 0.1 s.
        time.sleep(0.15)


def send(sender_id: int, count: int = 5) -> Activity:
    return services.activity_send(
        sender_id=sender_id,
        total_amount=Decimal("10.00"),
        total_count=count,
        strategy="distributed_lock",
        expires_in=3600,
    )


@pytest.mark.django_db(transaction=True)
def test_lock_key_shares_the_activity_hash_tag():
    assert lock_key(42) == "rp:{42}:lock"


@pytest.mark.django_db(transaction=True)
def test_a_grab_that_cannot_get_the_lock_in_time_answers_contended(make_users, sender):
    user = make_users(1)[0]
    activity = send(sender.pk)
    held = activity_lock(activity.pk, wait=0)
    assert held.acquire()

    with override_settings(REDPACK_LOCK_WAIT=0.3):
        started = time.monotonic()
        answer = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
        waited = time.monotonic() - started
    assert answer == GrabResult(Outcome.CONTENDED)
    # redis-py gives up as soon as its next poll would fall after the deadline.
    assert 0.3 - LOCK_POLL_SECONDS <= waited < 3
    assert not GrabDetail.objects.filter(activity=activity).exists()

    held.release()
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=user.pk).outcome is Outcome.GRABBED
    )
    activity.refresh_from_db()
    assert audit_activity(activity).ok


def blocked_by_this_connection() -> bool:
    """Some transaction waits for a row lock that this connection's transaction holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w"
            " JOIN information_schema.INNODB_TRX t ON t.trx_id = w.blocking_trx_id"
            " WHERE t.trx_mysql_thread_id = CONNECTION_ID()"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.django_db(transaction=True)
def test_a_write_whose_lock_expired_before_commit_is_fenced_off(make_users, sender, caplog):
    """A grab pauses inside its transaction past its lock's lifetime, a second writer takes the
    lock and writes; the paused grab's fenced UPDATE then matches no row and rolls back."""
    user = make_users(1)[0]
    activity = send(sender.pk)
    redis = get_redis_connection("default")
    answers: list[GrabResult] = []

    def paused_grab() -> None:
        try:
            answers.append(services.activity_grab(activity_id=activity.pk, user_id=user.pk))
        finally:
            connection.close()

    with override_settings(REDPACK_LOCK_TIMEOUT=0.3):
        with transaction.atomic():
            # Holding the activity row pauses the grab at its UPDATE, after it read the row.
            Activity.objects.select_for_update().get(pk=activity.pk)
            grabber = threading.Thread(target=paused_grab)
            grabber.start()
            wait_until(blocked_by_this_connection)
            wait_until(lambda: not redis.exists(lock_key(activity.pk)))  # its lock expired
            second_writer = activity_lock(activity.pk, wait=0)
            assert second_writer.acquire()
            Activity.objects.filter(pk=activity.pk).update(version=F("version") + 1)
        grabber.join(timeout=30)

    assert answers == [GrabResult(Outcome.CONTENDED)]
    assert "fenced" in caplog.text and "expired before release" in caplog.text
    # The paused grab's release was token-checked: the second writer still holds its lock.
    assert second_writer.owned()
    second_writer.release()
    activity.refresh_from_db()
    assert not GrabDetail.objects.filter(activity=activity).exists()
    assert (activity.surplus_count, activity.surplus_amount) == (5, Decimal("10.00"))
    assert audit_activity(activity).ok


@pytest.mark.django_db(transaction=True)
def test_a_grab_waits_for_its_process_turn_before_the_lock_within_the_same_wait(make_users, sender):
    """Another grab of this process holds the activity's turn (it is polling for or holding
    the Redis lock): this one sleeps on the turn, never asks Redis, and gives up `contended`
    when REDPACK_LOCK_WAIT has passed; once the turn is free it grabs."""
    user = make_users(1)[0]
    activity = send(sender.pk)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with turns.turn(activity.pk):
            inside.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(30)
        with override_settings(REDPACK_LOCK_WAIT=0.2):
            answer = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
        assert answer == GrabResult(Outcome.CONTENDED)
        assert not get_redis_connection("default").exists(lock_key(activity.pk))
    finally:
        release.set()
        holder.join(30)
    assert not GrabDetail.objects.filter(activity=activity).exists()
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=user.pk).outcome is Outcome.GRABBED
    )
    activity.refresh_from_db()
    assert audit_activity(activity).ok
