"""What /healthz reports: the database, Redis, the Celery broker, the worker heartbeat, persist lag.

- database and Redis are needed to answer grabs: either one down means 503.
- broker and worker are needed for expiry, refunds and (async strategies) persistence: either
  one down means `degraded`, still 200, since grabs are answered.
- the worker heartbeat is a beat task every REDPACK_HEARTBEAT_SECONDS that a worker runs: it
  proves beat, broker and a worker together. Older than STALE_BEATS intervals: stale.
- persist lag: how long the oldest acknowledged grab has waited for the database, the largest
  over the strategies that write later (GrabStrategy.health); null while none does. Beside it,
  the sections those strategies add (redis_queue_async's `persist`: grabs waiting and the
  oldest one's age), from the same reading.
"""

import time
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django_redis import get_redis_connection

from strategies import registry

HEARTBEAT_KEY = "rp:heartbeat:worker"
STALE_BEATS = 4  # heartbeats missed before the worker counts as stale
PROBE_TIMEOUT = 2.0


def record_heartbeat() -> None:
    """Called by the worker: now is the last time a worker ran a task from beat."""
    ttl = max(60, int(settings.REDPACK_HEARTBEAT_SECONDS * STALE_BEATS * 10))
    get_redis_connection("default").set(HEARTBEAT_KEY, f"{time.time():.3f}", ex=ttl)


def _error(exc: Exception) -> str:
    return f"error: {type(exc).__name__}: {exc}"


def check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "down", reported as text
        return _error(exc)


def check_redis() -> str:
    try:
        get_redis_connection("default").ping()
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return _error(exc)


def check_broker() -> str:
    url = settings.CELERY_BROKER_URL
    try:
        if url.startswith(("redis://", "rediss://", "unix://")):
            client = redis.Redis.from_url(
                url, socket_timeout=PROBE_TIMEOUT, socket_connect_timeout=PROBE_TIMEOUT
            )
            with client:
                client.ping()
        else:
            from redpack.celery import app

            with app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=PROBE_TIMEOUT)
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return _error(exc)


def heartbeat_age() -> float | None:
    """Seconds since a worker last ran the heartbeat task; None if none ever did."""
    try:
        value = get_redis_connection("default").get(HEARTBEAT_KEY)
    except Exception:  # noqa: BLE001 - Redis down is reported by check_redis
        return None
    return None if value is None else max(0.0, time.time() - float(value))


def check_worker(age: float | None) -> str:
    if age is None:
        return "no heartbeat yet"
    if age > settings.REDPACK_HEARTBEAT_SECONDS * STALE_BEATS:
        return f"stale: last heartbeat {age:.0f} s ago"
    return "ok"


def report() -> tuple[dict[str, Any], int]:
    """The health document and its HTTP status."""
    age = heartbeat_age()
    checks = {
        "database": check_database(),
        "redis": check_redis(),
        "broker": check_broker(),
        "worker": check_worker(age),
    }
    lag: float | None = None
    sections: dict[str, Any] = {"persist": {"error": "Redis is down"}}
    if checks["redis"] == "ok":
        try:
            lag, sections = registry.health()
        except Exception as exc:  # noqa: BLE001 - a strategy's probe failing is not the
            sections = {"persist": {"error": _error(exc)}}  # service failing: reported as text
    if checks["database"] != "ok" or checks["redis"] != "ok":
        status, code = "down", 503
    elif checks["broker"] != "ok" or checks["worker"] != "ok":
        status, code = "degraded", 200
    else:
        status, code = "ok", 200
    body = {
        "status": status,
        "checks": checks,
        "database_vendor": connection.vendor,
        "worker_heartbeat_age_seconds": None if age is None else round(age, 1),
        "persist_lag_seconds": None if lag is None else round(lag, 3),
        **sections,
    }
    return body, code
