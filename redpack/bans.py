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

A grab of an activity the process knows has ended is answered from memory and asks Redis
nothing (redpack/finished.py `answer_now`); it asks this process's copy of the set instead
(`disabled_locally`), no older than REDPACK_BANS_LOCAL_SECONDS: every change of the set bumps a
version beside it, which one request reads when the copy is due, and the set is read again
only when the version moved, in the same round trip (`_READ_COPY`). A set of more than
MAX_COPIED users is not copied: those requests ask Redis, as with Redis away. Such an answer
grants nothing, so a ban reaches it within that bound; a grab that could be granted still asks
Redis with its request.
"""

import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django_redis import get_redis_connection
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

KEY = "rp:users:disabled"
VERSION_KEY = "rp:users:disabled:version"  # bumped with every change of KEY (set_disabled, sync)
MAX_REMEMBERED = 100_000  # answers one process keeps at most (then it starts afresh)
# Users a process copies the set with at most (`disabled_locally`): a larger set would cost
# every process its memory and Redis an SMEMBERS of it at each change.
MAX_COPIED = 100_000
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


# Add or remove the user, and bump the version only if the set changed: signals call it on every
# save of a user, most of which change nothing, and a bump sends every process's copy to re-read
# the whole set (`disabled_locally`).
_SET_DISABLED = """
if redis.call(ARGV[2], KEYS[1], ARGV[1]) == 1 then redis.call('INCR', KEYS[2]) end
"""


def set_disabled(user_id: int, disabled: bool) -> None:
    """Record a user's state now (signals call it on save and delete)."""
    command = "SADD" if disabled else "SREM"
    get_redis_connection("default").eval(_SET_DISABLED, 2, KEY, VERSION_KEY, user_id, command)
    _remember(user_id, disabled, clock())


# A due copy's one round trip: the version alone while it is the copy's (ARGV[1]); else the
# version and the members, or false for them when the set names more than ARGV[2] users.
_READ_COPY = """
local version = redis.call('GET', KEYS[2])
if version == ARGV[1] then return {version} end
if redis.call('SCARD', KEYS[1]) > tonumber(ARGV[2]) then return {version, false} end
return {version, redis.call('SMEMBERS', KEYS[1])}
"""


@dataclass(frozen=True)
class _Copy:
    members: frozenset[int]
    version: bytes | None  # VERSION_KEY when the members were read
    read_at: float  # when the version was last found unchanged


_copy: _Copy | None = None
_copying = threading.Lock()
_unreadable_until = float("-inf")  # after a failed read, none is tried before then


def disabled_locally(user_id: int) -> bool | None:
    """Whether the set names the user, by this process's copy of it, at most
    REDPACK_BANS_LOCAL_SECONDS old; None when it cannot be read now (the caller asks the usual
    way). One request reads the version when the copy is due; the others read the copy
    meanwhile, or wait for the first copy."""
    copy, now = _copy, clock()
    if copy is None and now < _unreadable_until:
        return None  # not asked again at once: each request would wait for Redis in turn
    if copy is None or now - copy.read_at >= settings.REDPACK_BANS_LOCAL_SECONDS:
        if _copying.acquire(blocking=copy is None):
            try:
                copy = _read_copy(_copy, now)
            finally:
                _copying.release()
        else:
            copy = _copy  # another request is reading it
    return None if copy is None else user_id in copy.members


def _read_copy(copy: _Copy | None, now: float) -> _Copy | None:
    global _copy, _unreadable_until
    if copy is not None and now - copy.read_at < settings.REDPACK_BANS_LOCAL_SECONDS:
        return copy  # read by the request this one waited for
    if copy is None and now < _unreadable_until:
        return None
    known = copy.version if copy is not None and copy.version is not None else b""
    try:
        reply = get_redis_connection("default").eval(
            _READ_COPY, 2, KEY, VERSION_KEY, known, MAX_COPIED
        )
    except RedisError as exc:
        logger.warning("bans: the set is not readable now: %s", exc)
        _copy, _unreadable_until = None, now + settings.REDPACK_BANS_LOCAL_SECONDS
        return _copy
    if len(reply) == 1 and copy is not None:  # the version did not move
        _copy = _Copy(copy.members, reply[0], now)
    elif reply[1] is None:
        logger.info("bans: the set names more than %d users: not copied", MAX_COPIED)
        _copy, _unreadable_until = None, now + settings.REDPACK_BANS_LOCAL_SECONDS
    else:
        _copy = _Copy(frozenset(int(m) for m in reply[1]), reply[0], now)
    return _copy


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
    pipe.incr(VERSION_KEY)  # also for what changed the set without a bump: copies read it again
    pipe.scard(KEY)
    size = pipe.execute()[-1]
    forget()
    return int(size)


def forget() -> None:
    global _copy, _unreadable_until
    with _lock:
        _remembered.clear()
        _copy, _unreadable_until = None, float("-inf")


def _remember(user_id: int, disabled: bool, when: float) -> None:
    with _lock:
        if len(_remembered) >= MAX_REMEMBERED:
            _remembered.clear()
        _remembered[user_id] = (disabled, when)
