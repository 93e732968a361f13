"""The grab script's own connection per thread (strategies/lua: Script.run_pinned), against the
real Redis: a connection Redis closed, a script Redis forgot and a fork never cost a grab or
give one twice."""

import os

import pytest

from redpack import services
from strategies import lua
from strategies.base import Outcome
from strategies.lua import redis_client
from tests.strategies.test_lost_replies import assert_consistent, send, settled_rows

pytestmark = pytest.mark.django_db(transaction=True)

STRATEGIES = ["redis_counter", "redis_queue_async"]


def pinned_client_id() -> int:
    """Redis's id of this thread's pinned connection (asked on that connection)."""
    pinned = lua._pinned(redis_client())
    assert pinned is not None
    pinned.send_command("CLIENT", "ID")
    return int(pinned.read_response())


def assert_rows(activity, users: list[int]) -> None:  # type: ignore[no-untyped-def]
    assert sorted(settled_rows(activity)) == sorted(users)
    assert_consistent(activity)


@pytest.mark.parametrize("idle", ["busy", "idle"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_pinned_connection_redis_closed_costs_no_grab(
    strategy, idle, monkeypatch, make_users, sender
):
    """Killed by Redis between two grabs: when the thread was idle, the check before use makes
    the connection again; when busy (no check), the grab's re-run does. Either way the second
    user gets exactly one packet."""
    activity = send(sender, strategy)
    first, second = make_users(2)
    assert services.activity_grab(activity_id=activity.pk, user_id=first.pk).outcome is (
        Outcome.GRABBED
    )
    killed = pinned_client_id()
    assert redis_client().client_kill_filter(_id=killed) == 1
    monkeypatch.setattr(lua, "IDLE_CHECK_SECONDS", -1.0 if idle == "idle" else 3600.0)

    again = services.activity_grab(activity_id=activity.pk, user_id=second.pk)

    assert again.outcome is Outcome.GRABBED
    monkeypatch.setattr(lua, "IDLE_CHECK_SECONDS", 3600.0)
    assert pinned_client_id() != killed
    assert_rows(activity, [first.pk, second.pk])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_script_redis_forgot_is_loaded_again(strategy, make_users, sender):
    activity = send(sender, strategy)
    first, second = make_users(2)
    services.activity_grab(activity_id=activity.pk, user_id=first.pk)
    redis_client().script_flush()

    again = services.activity_grab(activity_id=activity.pk, user_id=second.pk)

    assert again.outcome is Outcome.GRABBED
    assert_rows(activity, [first.pk, second.pk])


def test_a_forked_child_never_uses_its_parents_connection(make_users, sender):
    activity = send(sender, "redis_counter")
    (user,) = make_users(1)
    services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    parents = lua._pinned(redis_client())
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            own = lua._pinned(redis_client())
            os.write(write, b"new" if own is not parents else b"same")
        finally:
            os._exit(0)
    os.close(write)
    told = os.read(read, 16)
    os.waitpid(child, 0)
    assert told == b"new"
    assert lua._pinned(redis_client()) is parents
