"""Users whose tokens no longer count: deactivated (is_active False) or deleted.

A grab authenticates by its signed token alone (no MySQL query per request), so an access token
would outlive a ban by up to its lifetime. Instead the disabled users' ids live in one Redis set,
kept by signals on every save or delete of a user and re-read from MySQL by a beat task every
REDPACK_BANS_SYNC_SECONDS (for changes that bypass signals, such as QuerySet.update). The grab
and ping views ask the set on every request, inside the one round trip they make anyway
(redpack/api/gate.py; for a grab whose strategy carries the checks, inside the strategy's own:
strategies/request_checks.py), so a ban takes effect at once. `is_disabled` (the same question
on its own) remembers an answer for REDPACK_BANS_LOCAL_SECONDS per process. With Redis away,
MySQL is asked instead: slower, never wrong.
"""

import logging
import threading
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django_redis import get_redis_connection
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

KEY = "rp:users:disabled"
MAX_REMEMBERED = 100_000  # answers one process keeps at most (then it starts afresh)
clock = time.monotonic  # what remembered answers age by (tests set it)

_lock = threading.Lock()
_remembered: dict[int, tuple[bool, float]] = {}  # user id -> (disabled, when asked)


def is_disabled(user_id: int) -> bool:
    now = clock()
    with _lock:
        known = _remembered.get(user_id)
    if known is not None and now - known[1] < settings.REDPACK_BANS_LOCAL_SECONDS:
        return known[0]
    try:
        disabled = bool(get_redis_connection("default").sismember(KEY, user_id))
    except RedisError:
        logger.warning("bans: Redis is away, asking MySQL whether user %s is active", user_id)
        disabled = not get_user_model().objects.filter(pk=user_id, is_active=True).exists()
    _remember(user_id, disabled, now)
    return disabled


def set_disabled(user_id: int, disabled: bool) -> None:
    """Record a user's state now (signals call it on save and delete)."""
    client = get_redis_connection("default")
    if disabled:
        client.sadd(KEY, user_id)
    else:
        client.srem(KEY, user_id)
    _remember(user_id, disabled, clock())


def sync() -> int:
    """Add every inactive user to the set and take out those active again; deleted users'
    ids stay (MySQL no longer knows them). Returns how many users the set names."""
    users = get_user_model().objects
    client = get_redis_connection("default")
    inactive = [str(pk) for pk in users.filter(is_active=False).values_list("pk", flat=True)]
    named = [int(member) for member in client.smembers(KEY)]
    active = [
        str(pk) for pk in users.filter(pk__in=named, is_active=True).values_list("pk", flat=True)
    ]
    pipe = client.pipeline(transaction=True)
    if inactive:
        pipe.sadd(KEY, *inactive)
    if active:
        pipe.srem(KEY, *active)
    pipe.scard(KEY)
    size = pipe.execute()[-1]
    forget()
    return int(size)


def forget() -> None:
    with _lock:
        _remembered.clear()


def _remember(user_id: int, disabled: bool, when: float) -> None:
    with _lock:
        if len(_remembered) >= MAX_REMEMBERED:
            _remembered.clear()
        _remembered[user_id] = (disabled, when)
