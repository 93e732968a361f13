"""What a grab request (and the ping, an authenticated request that does nothing) asks Redis
before its work: one round trip, or none for a grab whose strategy makes the same checks in its
own round trip (`carried`, below).

The user's grab throttle (its window's count, redpack/ratelimit.py), whether the user is
disabled (the bans set, redpack/bans.py) and whether the activity is known to be finished
(redpack/finished.py, with what the flag has left) go out in one script run
(ratelimit.count_and_read), on the thread's own connection. The token itself is
checked without any store (a signed JWT), so a grab that is refused, throttled or answered from
the finished flag costs this one round trip and no MySQL query; a grab that the process can
answer from its own memory of the activity's end costs none (api/views.py GrabView).

With Redis away, or the script's reply lost, the throttle counts in this process, the ban is
asked again (bans.is_disabled: Redis through the pool, else MySQL), and the finished flag is
this process's own memory.

A grab whose strategy makes the same checks in its own round trip (GrabStrategy.carries_checks,
strategies/request_checks.py) sends none of its own: `carried` gives it the checks to pass on.
"""

from dataclasses import dataclass

from django.conf import settings
from redis.exceptions import RedisError

from redpack import bans, finished, metrics, ratelimit
from redpack.errors import RequestRefused
from strategies.base import RequestChecks


@dataclass(frozen=True)
class Gate:
    wait: float | None  # throttled: seconds until the window ends
    disabled: bool
    finished: bytes | None  # the activity's finished flag in Redis, if asked and set
    finished_ttl_ms: int | None = None  # what the flag has left


def _window(user_id: int, scope: str | None, now: float) -> ratelimit.Window | None:
    rate = settings.REDPACK_THROTTLE_RATES.get(scope) if scope else None
    if not rate:
        return None
    return ratelimit.window(scope or "", str(user_id), ratelimit.Rate.parse(rate), now)


@dataclass(frozen=True)
class Carried:
    """The checks a grab's strategy makes in its own script run (GrabStrategy.grab_checked)
    instead of `check`: the same ban and throttle window, without the finished flag (the
    script answers sold out and closed itself)."""

    checks: RequestChecks
    window: ratelimit.Window | None
    now: float

    def wait(self, count: int | None) -> float:
        """The seconds to wait, for a request the script found over the window."""
        found = None if self.window is None or count is None else self.window.wait(count, self.now)
        return 1.0 if found is None else found


def carried(*, user_id: int, scope: str | None) -> Carried:
    now = ratelimit.clock()
    window = _window(user_id, scope, now)
    if window is None:
        return Carried(RequestChecks(bans.KEY), None, now)
    checks = RequestChecks(bans.KEY, window.key, window.rate.limit, window.expire_seconds)
    return Carried(checks, window, now)


def throttled_from_memory(*, user_id: int, scope: str | None) -> float | None:
    """The wait for a request whose throttle window this process has already found over its
    limit (ratelimit.Window.known_over), answered without a round trip; None: the request is
    checked as usual (not known over here, or the process's copy of the bans cannot be read).
    The ban comes first, as in the scripts: RequestRefused for a user the process's copy of the
    bans names (bans.disabled_locally)."""
    now = ratelimit.clock()
    window = _window(user_id, scope, now)
    if window is None or not window.known_over(now):
        return None
    disabled = bans.disabled_locally(user_id)
    if disabled is None:
        return None
    if disabled:
        raise RequestRefused(disabled=True)
    return window.throttled(now)


def check(*, user_id: int, scope: str | None = None, activity_id: int | None = None) -> Gate:
    """The user's ban, and with `scope` its throttle, with `activity_id` the activity's
    finished flag, in one script run."""
    now = ratelimit.clock()
    window = _window(user_id, scope, now)
    flag = None if activity_id is None else finished.key(activity_id)
    try:
        read = ratelimit.count_and_read(window, member_of=(bans.KEY, user_id), read=flag)
    except RedisError as exc:
        metrics.store_error(exc, "gate")
        wait = None
        if window is not None:
            wait = window.wait(ratelimit.count_locally(window, now, exc), now)
        return Gate(wait, bans.is_disabled(user_id), None)
    wait = None if window is None or read.count is None else window.wait(read.count, now)
    return Gate(wait, read.member, read.value, read.ttl_ms)
