"""redis_queue_async beyond the contract, in this process: the grab path, redelivery, failures
and dead letters, the admin, audit and rebuild with grabs still on their way, lag."""

import logging
import threading
import time
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_redis import get_redis_connection

from redpack import expiry, services
from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail, PersistFailure, PersistFailureStatus
from redpack.money import to_cents
from strategies import registry
from strategies.base import Outcome
from strategies.redis_queue_async import persister, stream
from strategies.redis_state.keys import Keys
from tests.contract.harness import grab_concurrently

pytestmark = pytest.mark.django_db(transaction=True)
STRATEGY = "redis_queue_async"


def send(sender, count: int = 10, total: str = "10.00", **options) -> Activity:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal(total),
        total_count=count,
        strategy=STRATEGY,
        expires_in=options.pop("expires_in", 3600),
        **options,
    )


def grab_all(activity: Activity, user_ids: list[int]) -> dict[int, int]:
    """Each user grabs once; user id -> cents of every `grabbed` answer."""
    answers = {}
    for user_id in user_ids:
        result = services.activity_grab(activity_id=activity.pk, user_id=user_id)
        if result.outcome is Outcome.GRABBED:
            assert result.amount_cents is not None
            answers[user_id] = result.amount_cents
    return answers


def rows(activity: Activity) -> dict[int, int]:
    return {
        user_id: to_cents(amount)
        for user_id, amount in GrabDetail.objects.filter(activity=activity).values_list(
            "user_id", "amount"
        )
    }


def audited(activity: Activity, answers: dict[int, int] | None = None) -> list[str]:
    activity.refresh_from_db()
    told = None if answers is None else list(answers.items())
    return audit_activity(activity, answers=told).violations


def stream_length(activity: Activity) -> int:
    return int(get_redis_connection("default").xlen(Keys(activity.pk).persist))


def test_grab_answers_from_redis_alone_and_mysql_follows(make_users, sender):
    users = make_users(12)
    activity = send(sender, count=10)
    services.activity_grab(
        activity_id=activity.pk, user_id=users[0].pk
    )  # warms the strategy lookup

    with CaptureQueriesContext(connection) as queries:
        answers = grab_all(activity, [u.pk for u in users[1:]])
        again = services.activity_grab(activity_id=activity.pk, user_id=users[1].pk)
    assert len(queries) == 0, [q["sql"] for q in queries]
    assert len(answers) == 9  # 10 packets, one went to the warm-up grab
    assert (again.outcome, again.amount_cents) == (Outcome.ALREADY_GRABBED, answers[users[1].pk])
    assert rows(activity) == {}  # nobody persisted yet
    assert stream_length(activity) == 10
    lag = stream.lag()
    assert lag["pending"] == 10 and lag["oldest_age_seconds"] >= 0
    assert audited(activity) == []  # Redis agrees with MySQL plus the grabs on their way

    assert registry.get(STRATEGY).settle(activity_id=activity.pk, timeout=10)
    assert stream_length(activity) == 0
    assert stream.lag()["pending"] == 0
    persisted = rows(activity)
    assert len(persisted) == 10 and all(persisted[u] == c for u, c in answers.items())
    activity.refresh_from_db()
    assert activity.surplus_count == 0 and activity.surplus_amount == 0
    # TTL again once empty (it had none while holding grabs)
    assert get_redis_connection("default").pttl(Keys(activity.pk).persist) > 0


def test_the_grab_api_answers_without_a_single_mysql_query(make_users, sender):
    from rest_framework.test import APIClient
    from rest_framework_simplejwt.tokens import AccessToken

    first, second = make_users(2)
    activity = send(sender, count=5)
    clients = []
    for user in (first, second):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
        clients.append(client)
    clients[0].post(f"/api/activities/{activity.pk}/grab/")  # warms the strategy lookup
    with CaptureQueriesContext(connection) as queries:
        answer = clients[1].post(f"/api/activities/{activity.pk}/grab/").json()
    assert answer["outcome"] == "grabbed"
    assert len(queries) == 0, [q["sql"] for q in queries]


def test_an_entry_delivered_twice_is_one_row(make_users, sender):
    """Committed, then the consumer dies before XACK: the entry is reclaimed and written again."""
    users = make_users(6)
    activity = send(sender, count=5)
    answers = grab_all(activity, [u.pk for u in users])
    entries = stream.read_new(activity.pk, 100)
    assert len(entries) == 5
    assert persister._store(activity.pk, entries, redelivered=False) == 5  # committed, not acked

    assert persister.reclaim_all(min_idle_seconds=0, run_seconds=10) == 5  # delivered again
    assert persister._store(activity.pk, entries, redelivered=True) == 0  # and once more by hand
    assert stream_length(activity) == 0
    assert rows(activity) == answers
    activity.refresh_from_db()
    assert activity.surplus_count == 0
    assert audited(activity, answers) == []


def test_a_surge_waits_in_redis_until_it_ends_or_reaches_its_lag(settings):
    """`surging`: at least a batch waiting, the newest within one persist interval, the oldest
    younger than REDPACK_PERSIST_SURGE_LAG; any one condition false, or the bound 0, and the
    persister writes."""
    settings.REDPACK_PERSIST_BATCH = 100
    settings.REDPACK_PERSIST_INTERVAL = 0.5
    settings.REDPACK_PERSIST_SURGE_LAG = 5.0
    assert persister.surging(stream.Backlog(100, oldest_age_ms=4_999, newest_age_ms=499))
    assert not persister.surging(stream.Backlog(99, oldest_age_ms=4_999, newest_age_ms=499))
    assert not persister.surging(stream.Backlog(100, oldest_age_ms=4_999, newest_age_ms=500))
    assert not persister.surging(stream.Backlog(100, oldest_age_ms=5_000, newest_age_ms=499))
    settings.REDPACK_PERSIST_SURGE_LAG = 0
    assert not persister.surging(stream.Backlog(100, oldest_age_ms=0, newest_age_ms=0))


def test_the_persister_leaves_a_surging_stream_alone_and_settle_does_not(
    make_users, sender, settings
):
    """A run finds a batch waiting and the newest grab within the interval (an hour here, so
    that it holds however slow the machine): it writes nothing of it, and the activity with
    less than a batch waiting is written; with the bound 0 it writes everything; `settle` never
    waits for a surge."""
    settings.REDPACK_PERSIST_BATCH = 4
    settings.REDPACK_PERSIST_INTERVAL = 3600.0
    settings.REDPACK_PERSIST_SURGE_LAG = 3600.0
    activity, other = send(sender, count=6), send(sender, count=3)
    users = [u.pk for u in make_users(6)]
    answers = grab_all(activity, users)
    quiet = grab_all(other, users[:3])  # fewer than a batch: not a surge
    assert (len(answers), len(quiet)) == (6, 3)
    looks = stream.backlogs([activity.pk, other.pk])
    assert (looks[activity.pk].waiting, looks[other.pk].waiting) == (6, 3)

    assert persister.persist_all(run_seconds=10) == 3
    assert (stream_length(activity), rows(activity)) == (6, {})
    assert rows(other) == quiet

    settings.REDPACK_PERSIST_SURGE_LAG = 0
    assert persister.persist_all(run_seconds=10) == 6
    assert rows(activity) == answers
    assert audited(activity, answers) == []

    settings.REDPACK_PERSIST_SURGE_LAG = 3600.0
    more = send(sender, count=4)
    taken = grab_all(more, users[:4])
    assert persister.surging(stream.backlogs([more.pk])[more.pk])
    assert registry.get(STRATEGY).settle(activity_id=more.pk, timeout=10)
    assert rows(more) == taken


def test_a_held_stream_is_written_once_its_surge_ends_or_its_oldest_grab_reaches_the_bound(
    make_users, sender, settings, monkeypatch
):
    """The looks' ages are the stream's first and last ids against this machine's clock (set
    here relative to those ids: no wall clock in the test); a clock behind Redis's by less
    than an interval still holds, by more it writes."""
    settings.REDPACK_PERSIST_BATCH = 4
    settings.REDPACK_PERSIST_INTERVAL = 0.5
    settings.REDPACK_PERSIST_SURGE_LAG = 5.0
    activity = send(sender, count=6)
    answers = grab_all(activity, [u.pk for u in make_users(6)])
    ids = [
        entry_id
        for entry_id, _ in get_redis_connection("default").xrange(Keys(activity.pk).persist)
    ]
    first_ms, last_ms = (int(entry_id.split(b"-")[0]) for entry_id in (ids[0], ids[-1]))

    def look_at(clock_ms: int) -> stream.Backlog:
        monkeypatch.setattr(stream, "now_ms", lambda: clock_ms)
        return stream.backlogs([activity.pk])[activity.pk]

    assert look_at(last_ms + 100) == stream.Backlog(6, last_ms + 100 - first_ms, 100)
    assert persister.surging(look_at(last_ms + 100))
    assert persister.persist_all(run_seconds=10) == 0
    assert persister.surging(look_at(last_ms - 499))  # this clock 0.499 s behind Redis's
    assert not persister.surging(look_at(last_ms - 500))  # too far behind to tell
    assert not persister.surging(look_at(last_ms + 500))  # the newest is an interval old
    settings.REDPACK_PERSIST_SURGE_LAG = (last_ms + 100 - first_ms) / 1000
    assert not persister.surging(look_at(last_ms + 100))  # the oldest is at the bound
    assert persister.persist_all(run_seconds=10) == 6
    assert rows(activity) == answers
    assert stream.lag()["pending"] == 0


def test_a_bad_grab_does_not_hold_back_its_batch_then_goes_to_the_dead_letters(
    make_users, sender, settings, caplog
):
    """The grab API trusts the signed token: a user id MySQL does not know (yet) is accepted by
    Redis, and its row fails the foreign key, every time."""
    settings.REDPACK_PERSIST_MAX_ATTEMPTS = 3
    users = make_users(4)
    activity = send(sender, count=5)
    ghost_id = users[-1].pk + 1000
    answers = grab_all(activity, [users[0].pk, ghost_id, *[u.pk for u in users[1:]]])
    assert len(answers) == 5

    with caplog.at_level(logging.ERROR, logger="redpack.persist.failures"):
        assert persister.persist_all(run_seconds=10) == 5  # one batch read, split, 4 written
    assert set(rows(activity)) == {u.pk for u in users}
    failure = PersistFailure.objects.get()
    assert (failure.user_id, failure.attempts, failure.status) == (ghost_id, 1, "retrying")
    assert "IntegrityError" in failure.error
    logged = vars(caplog.records[-1])
    assert (logged["event"], logged["user"], logged["status"]) == (
        "persist_failed",
        ghost_id,
        "retrying",
    )
    assert stream_length(activity) == 1  # still in the stream, pending

    assert not registry.get(STRATEGY).settle(activity_id=activity.pk, timeout=0.5)
    for attempt in (2, 3):
        persister.reclaim_all(min_idle_seconds=0, run_seconds=10)
        failure.refresh_from_db()
        assert failure.attempts == attempt
    assert failure.status == PersistFailureStatus.DEAD
    assert stream_length(activity) == 0  # dead: out of the stream, into the dead letters
    assert stream.lag()["pending"] == 0
    assert not registry.get(STRATEGY).settle(activity_id=activity.pk, timeout=5)
    assert "1 grabs failed to persist" in " ".join(audited(activity))
    with pytest.raises(expiry.NotSettled):  # the ghost's packet is not refunded to the sender
        expiry.refund(activity_id=activity.pk, force=True)
    with pytest.raises(CommandError, match="1 activities not rebuilt"):
        call_command("redis_rebuild", "--activity", activity.pk)  # MySQL lacks the ghost's grab

    assert persister.retry_failure(failure.pk) is not None  # still no such user
    failure.refresh_from_db()
    assert failure.attempts == 4 and failure.status == PersistFailureStatus.DEAD
    get_user_model().objects.create(pk=ghost_id, username="ghost")
    assert persister.retry_failure(failure.pk) is None
    failure.refresh_from_db()
    assert failure.status == PersistFailureStatus.RESOLVED and failure.resolved_at
    assert registry.get(STRATEGY).settle(activity_id=activity.pk, timeout=5)
    assert rows(activity) == answers
    assert audited(activity, answers) == []
    expiry.refund(activity_id=activity.pk, force=True)
    assert audited(activity, answers) == []


def test_admin_shows_failures_and_lag_and_retries_with_the_permission(
    client, make_users, sender, settings
):
    settings.REDPACK_PERSIST_MAX_ATTEMPTS = 1
    users = make_users(2)
    activity = send(sender, count=3)
    ghost_id = users[-1].pk + 1000
    grab_all(activity, [users[0].pk, ghost_id])
    persister.persist_all(run_seconds=10)
    failure = PersistFailure.objects.get()
    assert failure.status == PersistFailureStatus.DEAD
    services.activity_grab(activity_id=activity.pk, user_id=users[1].pk)  # one more waiting

    staff = users[0]
    staff.is_staff = True
    staff.set_password("staff-pass-123")
    staff.save()
    view = Permission.objects.get(codename="view_persistfailure")
    staff.user_permissions.add(view, Permission.objects.get(codename="view_activity"))
    client.login(username=staff.username, password="staff-pass-123")
    page = client.get("/admin/redpack/persistfailure/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Waiting to persist: <strong>1</strong> grabs" in text
    assert str(ghost_id) in text
    assert 'value="retry"' not in text  # no permission, no action
    detail = client.get(f"/admin/redpack/activity/{activity.pk}/change/").content.decode()
    assert "1 in Redis, 1 failed" in detail

    get_user_model().objects.create(pk=ghost_id, username="ghost")
    action = {"action": "retry", "_selected_action": [failure.pk]}
    client.post("/admin/redpack/persistfailure/", action)
    failure.refresh_from_db()
    assert failure.status == PersistFailureStatus.DEAD  # refused without the permission

    staff.user_permissions.add(Permission.objects.get(codename="retry_persistfailure"))
    page = client.get("/admin/redpack/persistfailure/").content.decode()
    assert 'value="retry"' in page
    client.post("/admin/redpack/persistfailure/", action)
    failure.refresh_from_db()
    assert failure.status == PersistFailureStatus.RESOLVED
    assert GrabDetail.objects.filter(activity=activity, user_id=ghost_id).exists()


def test_healthz_reports_the_persist_lag(admin_client, make_users, sender):
    activity = send(sender, count=3)
    grab_all(activity, [u.pk for u in make_users(2)])
    body = admin_client.get("/healthz/details").json()
    assert body["persist"]["pending"] == 2 and body["persist"]["oldest_age_seconds"] >= 0
    assert body["persist_lag_seconds"] == body["persist"]["oldest_age_seconds"]
    registry.get(STRATEGY).settle(activity_id=activity.pk, timeout=10)
    body = admin_client.get("/healthz/details").json()
    assert body["persist"] == {"pending": 0, "oldest_age_seconds": 0.0}
    assert body["persist_lag_seconds"] == 0.0


def test_audit_names_a_grab_lost_on_its_way(make_users, sender):
    users = make_users(3)
    activity = send(sender, count=3)
    answers = grab_all(activity, [u.pk for u in users])
    redis = get_redis_connection("default")
    lost_id, fields = redis.xrange(Keys(activity.pk).persist, count=1)[0]
    redis.xdel(Keys(activity.pk).persist, lost_id)  # as if it vanished unpersisted
    lost_user = int(fields[b"user"])
    violations = " ".join(audited(activity))
    assert f"user {lost_user} has nothing in MySQL but" in violations
    assert registry.get(STRATEGY).settle(activity_id=activity.pk, timeout=10)
    assert lost_user not in rows(activity)
    assert "every `grabbed` answer is a row" in " ".join(
        audit_activity(activity, answers=list(answers.items())).checks
    )
    assert audited(activity, answers)  # the auditor says the acknowledged grab is missing


def test_redis_rebuild_waits_for_the_grabs_on_their_way(make_users, sender):
    users = make_users(8)
    activity = send(sender, count=6)
    first = grab_all(activity, [u.pk for u in users[:4]])
    assert stream_length(activity) == 4
    call_command("redis_rebuild", "--activity", activity.pk)  # persists them, then rebuilds
    assert stream_length(activity) == 0
    assert rows(activity) == first
    assert audited(activity, first) == []
    more = grab_all(activity, [u.pk for u in users[4:]])
    assert len(more) == 2
    assert services.activity_grab(activity_id=activity.pk, user_id=users[0].pk).outcome is (
        Outcome.ALREADY_GRABBED
    )
    assert registry.get(STRATEGY).settle(activity_id=activity.pk, timeout=10)
    assert audited(activity, {**first, **more}) == []


def test_the_index_lists_open_activities_and_drops_settled_closed_ones(make_users, sender):
    activity = send(sender, count=3)
    assert stream.registered() == [activity.pk]
    get_redis_connection("default").srem(stream.INDEX_KEY, activity.pk)  # lost
    persister.reclaim_all(min_idle_seconds=30, run_seconds=5)
    assert stream.registered() == [activity.pk]  # found again from MySQL

    answers = grab_all(activity, [u.pk for u in make_users(2)])
    closed = registry.get(STRATEGY).close(activity_id=activity.pk)
    assert closed.remaining_count == 1
    persister.reclaim_all(min_idle_seconds=30, run_seconds=5)
    assert stream.registered() == [activity.pk]  # closed, but grabs still on their way
    persister.persist_all(run_seconds=10)
    persister.reclaim_all(min_idle_seconds=30, run_seconds=5)
    assert stream.registered() == []
    expiry.refund(activity_id=activity.pk, force=True)
    assert audited(activity, answers) == []


def test_concurrent_grabs_and_persisters_write_each_grab_once(make_users, sender):
    """Grabbers and two beat-like persister runs at once, then a settle."""
    users = make_users(120)
    activity = send(sender, count=100, total="100.00")
    stop = threading.Event()

    def persist_in_a_loop() -> None:
        try:
            while not stop.is_set():
                persister.persist_all(run_seconds=1)
        finally:
            connection.close()

    runners = [threading.Thread(target=persist_in_a_loop) for _ in range(2)]
    for runner in runners:
        runner.start()
    try:
        answers = grab_concurrently(activity.pk, [u.pk for u in users], clicks_per_user=2)
    finally:
        stop.set()
        for runner in runners:
            runner.join(timeout=60)
    assert registry.get(STRATEGY).settle(activity_id=activity.pk, timeout=30)
    grabbed = {
        a.user_id: a.result.amount_cents for a in answers if a.result.outcome is Outcome.GRABBED
    }
    assert len(grabbed) == 100
    assert rows(activity) == grabbed
    assert audited(activity, grabbed) == []  # type: ignore[arg-type]


def test_the_stream_outlives_the_state_while_it_holds_grabs(make_users, sender, settings):
    """The state expires a grace period after the activity; a grab nobody persisted stays."""
    settings.REDPACK_REDIS_STATE_GRACE = 1
    (user,) = make_users(1)
    activity = send(sender, count=2, total="1.00", expires_in=2)
    answers = grab_all(activity, [user.pk])
    redis = get_redis_connection("default")
    keys = Keys(activity.pk)
    assert redis.pttl(keys.persist) == -1  # holding a grab: no expiry
    time.sleep(max(0.0, (activity.expires_at - timezone.now()).total_seconds()) + 1.2)
    assert not redis.exists(*keys.ordered())  # the state is gone
    assert stream_length(activity) == 1
    assert stream.lag()["pending"] == 1

    persister.persist_all(run_seconds=10)
    assert not redis.exists(keys.persist)  # empty, and its state gone: deleted
    assert rows(activity) == answers
    left = registry.get(STRATEGY).close(activity_id=activity.pk)
    assert (left.remaining_count, left.remaining_cents) == (1, 100 - answers[user.pk])
    persister.reclaim_all(min_idle_seconds=30, run_seconds=5)
    assert stream.registered() == []
    assert audited(activity, answers) == []
