"""/healthz and /healthz/details against the real database and Redis; "down" is a server
nobody listens on."""

import time

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django_redis import get_redis_connection
from rest_framework.test import APIClient

from redpack import health, services, tasks
from strategies import registry

from .dummy_strategies import DUMMIES

pytestmark = pytest.mark.django_db

CLOSED = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def staff(make_users):  # type: ignore[no-untyped-def]
    (user,) = make_users(1, prefix="staff")
    user.is_staff = True
    user.save()
    return user


@pytest.fixture
def healthz(staff):  # type: ignore[no-untyped-def]
    """The whole health document, as staff sees it."""

    def get() -> tuple[int, dict]:
        client = APIClient()
        client.force_authenticate(staff)
        response = client.get("/healthz/details")
        return response.status_code, response.json()

    return get


def anonymous() -> tuple[int, dict]:
    response = APIClient().get("/healthz")
    return response.status_code, response.json()


def test_without_a_worker_heartbeat_it_is_degraded_but_serving(healthz):
    code, body = healthz()
    assert code == 200
    assert body["status"] == "degraded"
    assert body["checks"] == {
        "database": "ok",
        "redis": "ok",
        "redis_state": "ok",
        "broker": "ok",
        "worker": "no heartbeat yet",
    }
    assert body["database_vendor"] == "mysql"
    assert body["worker_heartbeat_age_seconds"] is None
    assert body["persist_lag_seconds"] == 0.0  # redis_queue_async is registered, nothing waits
    assert body["persist"] == {"pending": 0, "oldest_age_seconds": 0.0}


def test_the_heartbeat_task_makes_it_ok(healthz):
    tasks.heartbeat()  # what the worker runs when beat sends it
    code, body = healthz()
    assert (code, body["status"], body["checks"]["worker"]) == (200, "ok", "ok")
    assert 0 <= body["worker_heartbeat_age_seconds"] < 5


def test_an_old_heartbeat_is_stale(healthz):
    age = settings.REDPACK_HEARTBEAT_SECONDS * health.STALE_BEATS + 30
    get_redis_connection("default").set(health.HEARTBEAT_KEY, time.time() - age)
    code, body = healthz()
    assert (code, body["status"]) == (200, "degraded")
    assert body["checks"]["worker"].startswith("stale: last heartbeat")


def test_broker_down_is_degraded(healthz):
    tasks.heartbeat()
    with override_settings(CELERY_BROKER_URL=CLOSED):
        code, body = healthz()
    assert (code, body["status"]) == (200, "degraded")
    assert body["checks"]["broker"].startswith("error: ConnectionError")


def test_redis_down_is_503(healthz):
    caches = {"default": {**settings.CACHES["default"], "LOCATION": CLOSED}}
    with override_settings(CACHES=caches):
        code, body = healthz()
    assert (code, body["status"]) == (503, "down")
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("error: ConnectionError")


def test_persist_lag_is_the_largest_a_strategy_reports(healthz):
    with override_settings(REDPACK_STRATEGIES={**settings.REDPACK_STRATEGIES, **DUMMIES}):
        code, body = healthz()
    assert body["persist_lag_seconds"] == 2.5


def test_anyone_gets_the_verdict_and_nothing_more():
    tasks.heartbeat()
    assert anonymous() == (200, {"status": "ok"})


def test_anonymous_health_names_no_error(monkeypatch):
    caches = {"default": {**settings.CACHES["default"], "LOCATION": CLOSED}}
    with override_settings(CACHES=caches):
        code, body = anonymous()
    assert (code, body) == (503, {"status": "down"})


def test_anonymous_health_does_not_read_the_strategies(monkeypatch):
    """Their sections cost one Redis read per async activity; the verdict needs none."""

    def unwanted() -> None:
        raise AssertionError("the anonymous verdict read the strategies' health")

    monkeypatch.setattr(health.registry, "health", unwanted)
    assert anonymous()[1] == {"status": "degraded"}  # no heartbeat yet


def test_the_verdict_is_reused_for_a_second(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(health, "clock", lambda: now[0])
    assert anonymous() == (200, {"status": "degraded"})
    tasks.heartbeat()
    now[0] += health.CACHE_SECONDS / 2
    assert anonymous() == (200, {"status": "degraded"})  # the same probe's verdict
    now[0] += health.CACHE_SECONDS / 2
    assert anonymous() == (200, {"status": "ok"})


def test_details_are_for_staff_only(make_users):
    (user,) = make_users(1)
    assert APIClient().get("/healthz/details").status_code == 401
    client = APIClient()
    client.force_authenticate(user)
    assert client.get("/healthz/details").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_open_activities_without_their_redis_state_are_degraded_until_rebuilt(
    healthz, sender, make_users
):
    """A Redis restarted without its data (embedded fakeredis) forgot the open activities:
    /healthz says degraded (their grabs answer contended) until `redis_rebuild --if-lost`."""
    tasks.heartbeat()
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="3.00", total_count=3, strategy="redis_counter"
    )
    assert healthz()[1]["status"] == "ok"
    get_redis_connection("default").flushdb()  # what a restart of an in-memory Redis leaves
    tasks.heartbeat()
    code, body = healthz()
    assert (code, body["status"]) == (200, "degraded")
    assert body["checks"]["redis_state"].startswith("lost: Redis holds no state for 1 open")
    assert f"({activity.pk})" in body["checks"]["redis_state"]
    health.forget_verdict()
    assert anonymous() == (200, {"status": "degraded"})
    (grabber,) = make_users(1)
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=grabber.pk).outcome == "contended"
    )

    call_command("redis_rebuild", "--if-lost")
    assert healthz()[1]["checks"]["redis_state"] == "ok"
    health.forget_verdict()
    assert anonymous() == (200, {"status": "ok"})
    assert services.activity_grab(activity_id=activity.pk, user_id=grabber.pk).outcome == "grabbed"


def test_the_redis_state_probe_is_one_read_while_nothing_is_lost(django_assert_num_queries):
    assert registry.state_lost() is None  # a fresh Redis: checked once, then remembered
    with django_assert_num_queries(0):
        assert registry.state_lost() is None


def test_details_show_the_crediting_lag(healthz, sender, make_users):
    from redpack import ledger, services

    activity = services.activity_send(
        sender_id=sender.pk, total_amount="3.00", total_count=3, strategy="pessimistic"
    )
    for user in make_users(2, balance="0"):
        services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    assert healthz()[1]["crediting"]["pending"] == 2
    ledger.grabs_credit(batch=10, run_seconds=60)
    assert healthz()[1]["crediting"] == {"pending": 0, "oldest_age_seconds": 0.0}


def test_a_probe_connection_mysql_closed_while_idle_is_made_again():
    """The probe keeps its connection; one MySQL closed meanwhile (wait_timeout, a restart:
    here KILL) fails at once, and the probe connects again rather than read MySQL as down."""
    assert health.check_database() == "ok"
    probe = health._probe.connections["default"]
    with connection.cursor() as cursor:
        cursor.execute(f"KILL {probe.thread_id()}")
    assert health.check_database() == "ok"
    assert health._probe.connections["default"] is not probe
