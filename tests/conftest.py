"""Fixtures on the real MariaDB and Redis. A missing service fails the run; nothing is skipped."""

from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import connection
from django_redis import get_redis_connection
from hypothesis import settings as hypothesis_settings
from redis.exceptions import ConnectionError as RedisConnectionError

from redpack import bans, finished, health, ledger, ratelimit, selectors
from tests.faults import FaultProxy

# Property tests draw the same examples every run, so that a failure fails the same way each
# time, and no example is failed for its time on a loaded machine.
hypothesis_settings.register_profile("redpack", derandomize=True, deadline=None)
hypothesis_settings.load_profile("redpack")

MIN_DB_CONNECTIONS = 1000  # the contract harness opens one connection per grabbing thread


@pytest.fixture(scope="session", autouse=True)
def real_services(django_db_setup, django_db_blocker) -> None:  # type: ignore[no-untyped-def]
    try:
        get_redis_connection("default").ping()
    except RedisConnectionError as exc:
        pytest.exit(f"Redis is not answering ({exc}); start it, tests need the real server", 2)
    # Not connection.cursor(): when no selected test uses the database, pytest-django sets up
    # no test database, and the configured one may not exist.
    with django_db_blocker.unblock(), connection._nodb_cursor() as cursor:
        cursor.execute("SELECT @@max_connections")
        (current,) = cursor.fetchone()
        if current < MIN_DB_CONNECTIONS:
            cursor.execute(f"SET GLOBAL max_connections = {MIN_DB_CONNECTIONS}")


@pytest.fixture(autouse=True)
def clean_redis() -> Iterator[None]:
    """Each test starts from an empty test Redis database (ids are reused between tests)."""
    get_redis_connection("default").flushdb()
    selectors.activity_facts.cache_clear()
    health.forget_verdict()
    health.close_probes()
    bans.forget()
    finished.forget()
    ratelimit.forget()
    yield


@pytest.fixture
def one_throttle_window(monkeypatch):  # type: ignore[no-untyped-def]
    """Every request of a test in the same rate-limit window, whatever the wall clock does
    meanwhile (a window turning mid-test would start the counts again), and no per-process
    counts left from another test."""
    monkeypatch.setattr(ratelimit, "clock", lambda: 1_800_000_000.0)
    monkeypatch.setattr(ratelimit, "_local", ratelimit._LocalCounters())


@pytest.fixture
def make_users(db) -> Callable[[int], list[AbstractUser]]:  # type: ignore[no-untyped-def]
    """Users whose wallets hold REDPACK_STARTING_BALANCE, as bench and demo users do, or
    `balance` (a decimal string; "0" for none)."""

    def make(count: int, prefix: str = "user", balance: str | None = None) -> list[AbstractUser]:
        User = get_user_model()
        start = User.objects.count()
        names = [f"{prefix}{start + i}" for i in range(count)]
        User.objects.bulk_create([User(username=name) for name in names])
        users = list(User.objects.filter(username__in=names).order_by("pk"))
        ledger.wallets_top_up(user_ids=[user.pk for user in users], to=balance, memo="test users")
        return users

    return make


@pytest.fixture
def sender(make_users) -> AbstractUser:  # type: ignore[no-untyped-def]
    return make_users(1, prefix="sender")[0]


def pytest_generate_tests(metafunc):  # type: ignore[no-untyped-def]
    """Every registered safe strategy joins the contract by being registered."""
    if "safe_strategy" in metafunc.fixturenames:
        from django.conf import settings

        from strategies import registry

        names = [n for n in settings.REDPACK_STRATEGIES if registry.get(n).safe]
        metafunc.parametrize("safe_strategy", names)


@pytest.fixture
def redis_proxy(settings) -> Iterator[FaultProxy]:  # type: ignore[no-untyped-def]
    """Every Redis command of the app, the strategies' scripts included, through the proxy."""
    url = urlsplit(settings.CACHES["default"]["LOCATION"])
    proxy = FaultProxy((url.hostname or "127.0.0.1", url.port or 6379))
    caches = {name: {**conf} for name, conf in settings.CACHES.items()}
    caches["default"]["LOCATION"] = urlunsplit(url._replace(netloc=f"127.0.0.1:{proxy.port}"))
    settings.CACHES = caches  # the strategies' client and scripts follow (strategies/lua)
    yield proxy
    proxy.cut()
