"""Deactivated and deleted users are refused by token within seconds, on every strategy, with
no MySQL query per request (redpack/bans.py); refresh is refused too."""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import RefreshToken

from redpack import bans, services
from redpack.models import GrabDetail
from strategies import registry

pytestmark = pytest.mark.django_db(transaction=True)

SAFE = [name for name in registry.names() if registry.get(name).safe]


def client_of(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def grab(client: APIClient, activity_id: int):  # type: ignore[no-untyped-def]
    return client.post(f"/api/activities/{activity_id}/grab/")


@pytest.mark.parametrize("strategy", SAFE)
def test_a_deactivated_user_is_refused_at_once(strategy, sender, make_users):
    first, second = (
        services.activity_send(
            sender_id=sender.pk, total_amount="5.00", total_count=5, strategy=strategy
        )
        for _ in range(2)
    )
    (user,) = make_users(1)
    client = client_of(str(RefreshToken.for_user(user).access_token))
    assert grab(client, first.pk).status_code == 200

    user.is_active = False
    user.save()

    refused = grab(client, second.pk)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "user_inactive"
    assert not GrabDetail.objects.filter(activity=second).exists()


def test_the_check_costs_no_mysql_query(sender, make_users):
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy="redis_queue_async"
    )
    (user,) = make_users(1)
    client = client_of(str(RefreshToken.for_user(user).access_token))
    grab(client, activity.pk)  # the strategy's name is read once per process
    with CaptureQueriesContext(connection) as queries:
        assert grab(client, activity.pk).json()["outcome"] == "already_grabbed"
    assert len(queries) == 0


def test_other_processes_see_a_ban_within_the_local_interval(settings, monkeypatch, make_users):
    (user,) = make_users(1)
    now = [500.0]
    monkeypatch.setattr(bans, "clock", lambda: now[0])
    assert not bans.is_disabled(user.pk)
    # Another process bans the user: Redis changes, this process still remembers "not banned".
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    bans.get_redis_connection("default").sadd(bans.KEY, user.pk)
    now[0] += settings.REDPACK_BANS_LOCAL_SECONDS / 2
    assert not bans.is_disabled(user.pk)
    now[0] += settings.REDPACK_BANS_LOCAL_SECONDS / 2
    assert bans.is_disabled(user.pk)


def test_sync_catches_changes_made_without_signals(make_users):
    banned, back, deleted = make_users(3, balance="0")  # a wallet would protect `deleted`
    get_user_model().objects.filter(pk=banned.pk).update(is_active=False)  # no signal
    bans.set_disabled(back.pk, True)  # banned, then let back in without a signal
    get_user_model().objects.filter(pk=deleted.pk).delete()
    assert bans.sync() == 2
    assert [bans.is_disabled(u.pk) for u in (banned, back, deleted)] == [True, False, True]


def test_with_redis_away_mysql_answers(settings, make_users):
    active, inactive = make_users(2)
    get_user_model().objects.filter(pk=inactive.pk).update(is_active=False)
    caches = {"default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.CACHES = caches
    assert [bans.is_disabled(active.pk), bans.is_disabled(inactive.pk)] == [False, True]


def test_the_process_copy_sees_a_ban_once_due_and_reads_the_set_only_when_it_moved(
    settings, monkeypatch, make_users
):
    """bans.disabled_locally, for the answers that ask Redis nothing: at most
    REDPACK_BANS_LOCAL_SECONDS old, and re-read whole only when the version moved."""
    user, other = make_users(2)
    now = [500.0]
    monkeypatch.setattr(bans, "clock", lambda: now[0])
    client = bans.get_redis_connection("default")
    assert bans.disabled_locally(user.pk) is False
    bans.set_disabled(user.pk, True)  # as a signal does, in another process
    now[0] += settings.REDPACK_BANS_LOCAL_SECONDS / 2
    assert bans.disabled_locally(user.pk) is False  # not due yet
    now[0] += settings.REDPACK_BANS_LOCAL_SECONDS / 2
    assert bans.disabled_locally(user.pk) is True

    client.sadd(bans.KEY, other.pk)  # written without the version's bump
    now[0] += settings.REDPACK_BANS_LOCAL_SECONDS
    assert bans.disabled_locally(other.pk) is False  # the version did not move: not re-read
    get_user_model().objects.filter(pk=other.pk).update(is_active=False)
    bans.sync()  # the beat's: bumps the version whatever it changed
    now[0] += settings.REDPACK_BANS_LOCAL_SECONDS
    assert bans.disabled_locally(other.pk) is True


def test_a_save_that_changes_no_ban_leaves_the_version_alone(make_users):
    """Signals record the state on every save of a user; only a change of the set moves the
    version, which sends every process's copy to read the whole set again."""
    (user,) = make_users(1)
    client = bans.get_redis_connection("default")
    before = client.get(bans.VERSION_KEY)
    user.first_name = "renamed"
    user.save()  # still active: the set does not change
    bans.set_disabled(user.pk, False)
    assert client.get(bans.VERSION_KEY) == before
    bans.set_disabled(user.pk, True)
    bans.set_disabled(user.pk, True)  # already in
    assert int(client.get(bans.VERSION_KEY)) == int(before or 0) + 1
    assert client.sismember(bans.KEY, user.pk)


def test_with_redis_away_the_process_copy_cannot_say_and_is_not_asked_again_at_once(
    settings, monkeypatch, make_users
):
    (user,) = make_users(1)
    now = [500.0]
    monkeypatch.setattr(bans, "clock", lambda: now[0])
    away = {"default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    with override_settings(CACHES=away):
        assert bans.disabled_locally(user.pk) is None
        asked = []
        monkeypatch.setattr(bans, "_read_copy", lambda *args: asked.append(args))
        assert bans.disabled_locally(user.pk) is None
        assert asked == []  # within the interval: no second wait for Redis
    monkeypatch.undo()
    now[0] += settings.REDPACK_BANS_LOCAL_SECONDS
    monkeypatch.setattr(bans, "clock", lambda: now[0])
    assert bans.disabled_locally(user.pk) is False  # Redis back, once the interval is over


def test_a_set_too_large_to_copy_is_not_copied_until_it_is_small_again(
    settings, monkeypatch, make_users
):
    """Past bans.MAX_COPIED users, no process copies the set: disabled_locally cannot say (the
    request asks Redis itself) and reads nothing more within the interval; once the set is
    small enough again, the copy is back."""
    first, second, third = make_users(3)
    now = [500.0]
    monkeypatch.setattr(bans, "clock", lambda: now[0])
    monkeypatch.setattr(bans, "MAX_COPIED", 1)
    bans.set_disabled(first.pk, True)
    bans.set_disabled(second.pk, True)
    assert bans.disabled_locally(third.pk) is None
    with monkeypatch.context() as within:
        asked: list[object] = []
        within.setattr(bans, "_read_copy", lambda *args: asked.append(args))
        assert bans.disabled_locally(third.pk) is None
        assert asked == []
    bans.set_disabled(second.pk, False)
    now[0] += settings.REDPACK_BANS_LOCAL_SECONDS
    assert [bans.disabled_locally(u.pk) for u in (first, second, third)] == [True, False, False]


@pytest.mark.parametrize("how", ["deactivated", "deleted"])
def test_refresh_is_refused(how, make_users):
    (user,) = make_users(1, balance="0")  # a user with a wallet cannot be deleted
    refresh = str(RefreshToken.for_user(user))
    if how == "deleted":
        user.delete()
    else:
        user.is_active = False
        user.save()
    response = APIClient().post("/api/token/refresh/", {"refresh": refresh}, format="json")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "no_active_account"


@pytest.mark.parametrize("strategy", ["redis_queue_async", "group_commit"])
def test_a_deactivated_user_is_refused_on_an_activity_known_finished(strategy, sender, make_users):
    """A strategy that carries the request's checks is not asked once the process knows the
    activity is finished (its grabs are answered from memory, without a round trip): the
    process's copy of the bans is asked first, so the ban still answers 401, not `sold_out`."""
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="1.00", total_count=1, strategy=strategy
    )
    first, second = make_users(2)
    clients = [client_of(str(RefreshToken.for_user(u).access_token)) for u in (first, second)]
    assert grab(clients[0], activity.pk).json()["outcome"] == "grabbed"
    assert grab(clients[1], activity.pk).json() == {"outcome": "sold_out"}  # now known here

    second.is_active = False
    second.save()
    refused = grab(clients[1], activity.pk)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "user_inactive"
    # the set holds deleted users too: the message says both
    assert refused.json()["error"]["message"] == "this user is deactivated or deleted"
