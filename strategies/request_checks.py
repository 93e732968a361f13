"""A web request's own checks (its user's ban and throttle, redpack/api/gate.py) made by the
grab's strategy in its own round trip (GrabStrategy.carries_checks), so that the request sends
Redis nothing before its grab: the Redis strategies make them in their grab script's run
(lua/grab.lua), group_commit in one script run for its whole batch (lua/check_requests.lua).
The rule itself is lua/checks.lua, which the gate's own script includes too.

A member whose checks fail gets RequestRefused and takes nothing. If the batch's checks get no
answer (Redis away, a lost reply), its members get ChecksNotMade, also having taken nothing, and
the view makes the checks itself (gate.check, with its fallbacks) before it grabs again.
"""

from redis.exceptions import RedisError

from redpack.errors import ChecksNotMade, RequestRefused

from .base import RequestChecks
from .lua import gate_script, run_script_pinned

REFUSALS = frozenset({"disabled", "throttled"})  # lua/grab.lua's answers to failed checks


def checks_arg(checks: RequestChecks | None) -> str:
    """A member's checks as the scripts take them ('' for none; lua/checks.lua `checked`)."""
    if checks is None:
        return ""
    window = checks.window_key or "-"
    # A negative limit (a mistyped rate) lets nothing through, as the gate's count > limit.
    return f"{checks.bans_key} {window} {max(checks.limit, 0)} {checks.expire_seconds}"


def refused(outcome: str, count: str | None = None) -> RequestRefused:
    """The error for a script's answer to failed checks: `disabled`, or `throttled` with the
    window's count."""
    if outcome == "disabled":
        return RequestRefused(disabled=True)
    return RequestRefused(disabled=False, count=int(count or 0))


def check_all(members: list[tuple[int, str]]) -> list[RequestRefused | ChecksNotMade | None]:
    """The checks of (user, checks_arg) members in one script run: per member None (go on, or
    no checks asked), RequestRefused, or ChecksNotMade when Redis gave no answer."""
    asked = [(user_id, checks) for user_id, checks in members if checks]
    if not asked:
        return [None] * len(members)
    args: list[int | str] = []
    for user_id, checks in asked:
        args += [user_id, checks]
    try:
        replies = iter(run_script_pinned(gate_script("check_requests"), [], args))
    except RedisError as exc:
        not_made = ChecksNotMade(str(exc))
        return [not_made if checks else None for _, checks in members]
    found: list[RequestRefused | ChecksNotMade | None] = []
    for _, checks in members:
        reply = next(replies).decode() if checks else ""
        if not reply:
            found.append(None)
        else:
            found.append(refused("disabled" if reply == "disabled" else "throttled", reply))
    return found
