"""What /healthz reports: the database, Redis (and the state open activities keep there), the
Celery broker, the worker heartbeat, persist lag.

Anyone may ask /healthz: it says `ok`, `degraded` or `down` and nothing else, from five probes
that cost the same however many activities there are, taken at most once per CACHE_SECONDS per
process. The details (each probe's result and error text, the persist lag and the strategies'
sections, whose cost grows with the activities) are for staff: /healthz/details.

- database and Redis are needed to answer grabs: either one down means 503. The database is
  asked on a connection of the probe's own that waits at most PROBE_TIMEOUT (`_Probe`); while
  it fails, nothing else here reads MySQL, where a request's connection would wait.
- broker and worker are needed for expiry, refunds and (async strategies) persistence: either
  one down means `degraded`, still 200, since grabs are answered.
- the worker heartbeat is a beat task every REDPACK_HEARTBEAT_SECONDS that a worker runs: it
  proves beat, broker and a worker together. Older than STALE_BEATS intervals: stale.
- Redis state: open activities whose strategy keeps state in Redis must find it there; a Redis
  restarted without its data lost it (GrabStrategy.state_lost: one read while nothing is lost).
  Lost means `degraded`: those grabs answer `contended` until `manage.py redis_rebuild`.
- persist lag: how long the oldest acknowledged grab has waited for the database, the largest
  over the strategies that write later (GrabStrategy.health); null while none does. Beside it,
  the sections those strategies add (redis_queue_async's `persist`: grabs waiting and the
  oldest one's age), from the same reading.
- crediting: grabs whose amount has not yet moved from the escrow to the grabber's wallet
  (redpack/ledger.py), how many and the oldest one's age in seconds.
"""

import math
import threading
import time
from contextlib import suppress
from typing import Any

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django_redis import get_redis_connection

from strategies import registry
from strategies.lua import takes_writes

from . import ledger

HEARTBEAT_KEY = "rp:heartbeat:worker"
STALE_BEATS = 4  # heartbeats missed before the worker counts as stale
PROBE_TIMEOUT = 2.0
DATABASE_DOWN = "not read: the database probe failed"
CACHE_SECONDS = 1.0  # how old the anonymous verdict may be
clock = time.monotonic  # what the cache ages by (tests set it)
_verdict_lock = threading.Lock()
_verdict: tuple[float, tuple[str, int]] | None = None


def record_heartbeat() -> None:
    """Called by the worker: now is the last time a worker ran a task from beat."""
    ttl = max(60, int(settings.REDPACK_HEARTBEAT_SECONDS * STALE_BEATS * 10))
    get_redis_connection("default").set(HEARTBEAT_KEY, f"{time.time():.3f}", ex=ttl)


def _error(exc: Exception) -> str:
    return f"error: {type(exc).__name__}: {exc}"


class _Probe:
    """The process's MySQL connections for the database probe, one per database, each waiting
    at most PROBE_TIMEOUT for a login or a reply (a request's own connection may wait
    DB_READ_TIMEOUT, 90 s in the web process). Kept open, so that a MySQL at max_connections
    does not read as down while the connections already open still serve; one that fails at
    once (closed while idle: wait_timeout, a restart) is made again and asked once more. One
    probe at a time: a caller that finds another probe running past PROBE_TIMEOUT (waiting on
    a MySQL that stalled) does not queue behind it, and reads the database as down."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.connections: dict[str, Any] = {}

    def select_one(self, alias: str) -> None:
        wrapper = connections[alias]
        if wrapper.vendor != "mysql":
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT 1")
            return
        if not self.lock.acquire(timeout=PROBE_TIMEOUT):
            raise TimeoutError(f"another probe has waited on MySQL for over {PROBE_TIMEOUT} s")
        try:
            probe = self.connections.pop(alias, None)
            if probe is not None:
                asked = time.monotonic()
                try:
                    self._ask(probe)
                except Exception:
                    if time.monotonic() - asked >= PROBE_TIMEOUT / 2:
                        raise  # it waited: MySQL itself is slow or stalled
                    probe = None  # closed while idle: a new connection, asked once more
            if probe is None:
                probe = self._connect(wrapper)
                self._ask(probe)
            self.connections[alias] = probe
        finally:
            self.lock.release()

    @staticmethod
    def _connect(wrapper: Any) -> Any:
        params = wrapper.get_connection_params()
        waits = max(1, math.ceil(PROBE_TIMEOUT))  # whole seconds; 0 would be no limit
        params.update(connect_timeout=waits, read_timeout=waits, write_timeout=waits)
        return wrapper.Database.connect(**params)

    @staticmethod
    def _ask(probe: Any) -> None:
        try:
            probe.query("SELECT 1")
            probe.store_result()
        except BaseException:
            with suppress(Exception):
                probe.close()  # lost, or mid-reply: never used again
            raise

    def close(self) -> None:
        with self.lock:
            for probe in self.connections.values():
                with suppress(Exception):
                    probe.close()
            self.connections.clear()


_probe = _Probe()


def check_database() -> str:
    """Default, and every shard's database while sharded (redpack/shards.py), each asked on
    its own connection, within PROBE_TIMEOUT (`_Probe`)."""
    try:
        for alias in (DEFAULT_DB_ALIAS, *settings.REDPACK_SHARDS):
            _probe.select_one(alias)
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "down", reported as text
        return _error(exc)


def check_redis() -> str:
    """One write (strategies.lua.takes_writes): a Redis that answers a PING but takes no write
    (a replica after a failover, full) cannot answer grabs either."""
    try:
        takes_writes(get_redis_connection("default"))
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


def check_redis_state(database: str, redis_: str) -> str:
    if database != "ok" or redis_ != "ok":
        return "unknown: the database or Redis is down"
    try:
        lost = registry.state_lost()
    except Exception as exc:  # noqa: BLE001
        return _error(exc)
    return "ok" if lost is None else f"lost: {lost}"


def checks(age: float | None) -> dict[str, str]:
    database, redis_ = check_database(), check_redis()
    return {
        "database": database,
        "redis": redis_,
        "redis_state": check_redis_state(database, redis_),
        "broker": check_broker(),
        "worker": check_worker(age),
    }


def judge(results: dict[str, str]) -> tuple[str, int]:
    if results["database"] != "ok" or results["redis"] != "ok":
        return "down", 503
    if any(results[name] != "ok" for name in ("redis_state", "broker", "worker")):
        return "degraded", 200
    return "ok", 200


def verdict() -> tuple[str, int]:
    """`ok`, `degraded` or `down` and the HTTP status, at most CACHE_SECONDS old; concurrent
    callers wait for one probe rather than each running their own."""
    global _verdict
    with _verdict_lock:
        if _verdict is None or clock() - _verdict[0] >= CACHE_SECONDS:
            _verdict = (clock(), judge(checks(heartbeat_age())))
        return _verdict[1]


def forget_verdict() -> None:
    global _verdict
    with _verdict_lock:
        _verdict = None


def close_probes() -> None:
    """The database probe's connections closed: the next probe connects anew."""
    _probe.close()


def report() -> tuple[dict[str, Any], int]:
    """The whole health document (staff) and its HTTP status."""
    age = heartbeat_age()
    results = checks(age)
    lag: float | None = None
    sections: dict[str, Any] = {"persist": {"error": "Redis is down"}}
    if results["redis"] == "ok":
        try:
            lag, sections = registry.health()
        except Exception as exc:  # noqa: BLE001 - a strategy's probe failing is not the
            sections = {"persist": {"error": _error(exc)}}  # service failing: reported as text
    crediting: dict[str, Any] = {"error": DATABASE_DOWN}
    if results["database"] == "ok":  # else the read would wait on the request's connection
        try:
            crediting = ledger.crediting_lag()
        except Exception as exc:  # noqa: BLE001 - the database being down is reported above
            crediting = {"error": _error(exc)}
    status, code = judge(results)
    body = {
        "status": status,
        "checks": results,
        "database_vendor": connection.vendor,
        "worker_heartbeat_age_seconds": None if age is None else round(age, 1),
        "persist_lag_seconds": None if lag is None else round(lag, 3),
        **sections,
        "crediting": crediting,
    }
    return body, code
