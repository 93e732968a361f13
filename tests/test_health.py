"""/healthz against the real database and Redis; "down" is a server nobody listens on."""

import time

import pytest
from django.conf import settings
from django.test import override_settings
from django_redis import get_redis_connection
from rest_framework.test import APIClient

from redpack import health, tasks

from .dummy_strategies import DUMMIES

pytestmark = pytest.mark.django_db

CLOSED = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def healthz() -> tuple[int, dict]:
    response = APIClient().get("/healthz")
    return response.status_code, response.json()


def test_without_a_worker_heartbeat_it_is_degraded_but_serving():
    code, body = healthz()
    assert code == 200
    assert body["status"] == "degraded"
    assert body["checks"] == {
        "database": "ok",
        "redis": "ok",
        "broker": "ok",
        "worker": "no heartbeat yet",
    }
    assert body["database_vendor"] == "mysql"
    assert body["worker_heartbeat_age_seconds"] is None
    assert body["persist_lag_seconds"] is None


def test_the_heartbeat_task_makes_it_ok():
    tasks.heartbeat()  # what the worker runs when beat sends it
    code, body = healthz()
    assert (code, body["status"], body["checks"]["worker"]) == (200, "ok", "ok")
    assert 0 <= body["worker_heartbeat_age_seconds"] < 5


def test_an_old_heartbeat_is_stale():
    age = settings.REDPACK_HEARTBEAT_SECONDS * health.STALE_BEATS + 30
    get_redis_connection("default").set(health.HEARTBEAT_KEY, time.time() - age)
    code, body = healthz()
    assert (code, body["status"]) == (200, "degraded")
    assert body["checks"]["worker"].startswith("stale: last heartbeat")


def test_broker_down_is_degraded():
    tasks.heartbeat()
    with override_settings(CELERY_BROKER_URL=CLOSED):
        code, body = healthz()
    assert (code, body["status"]) == (200, "degraded")
    assert body["checks"]["broker"].startswith("error: ConnectionError")


def test_redis_down_is_503():
    caches = {"default": {**settings.CACHES["default"], "LOCATION": CLOSED}}
    with override_settings(CACHES=caches):
        code, body = healthz()
    assert (code, body["status"]) == (503, "down")
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("error: ConnectionError")


def test_persist_lag_is_the_largest_a_strategy_reports():
    with override_settings(REDPACK_STRATEGIES={**settings.REDPACK_STRATEGIES, **DUMMIES}):
        code, body = healthz()
    assert body["persist_lag_seconds"] == 2.5
