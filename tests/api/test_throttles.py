"""Rate limits counted atomically in Redis (redpack/ratelimit.py): password guessing meets a
429, a burst gets exactly its rate through, and Redis away is never a 500."""

import json
import logging
import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django_redis import get_redis_connection
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import AccessToken

from redpack import bans, ratelimit, services
from redpack.models import GrabDetail
from strategies.lua import gate_script

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # every request of a test in one window: tests/conftest.py
    pytest.mark.usefixtures("one_throttle_window"),
]

CLOSED = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def login_limits(settings):  # type: ignore[no-untyped-def]
    settings.REDPACK_LOGIN_RATES = {"ip": "30/min", "username": "10/min"}


def test_thirty_wrong_passwords_meet_a_429(login_limits, make_users):
    (user,) = make_users(1)
    client = APIClient()
    codes = [
        client.post(
            "/api/token/", {"username": user.username, "password": "wrong"}, format="json"
        ).status_code
        for _ in range(30)
    ]
    assert codes[:10] == [401] * 10
    assert set(codes[10:]) == {429}
    refused = client.post(
        "/api/token/", {"username": user.username, "password": "wrong"}, format="json"
    )
    assert refused.json()["error"]["code"] == "throttled"
    assert 1 <= int(refused["Retry-After"]) <= 60


def test_the_login_paths_without_their_slash_count_in_the_same_limit(login_limits, make_users):
    """The API answers /api/token as /api/token/ (api/urls.py): both count, together."""
    (user,) = make_users(1)
    client = APIClient()
    codes = [
        client.post(
            path, {"username": user.username, "password": "wrong"}, format="json"
        ).status_code
        for path in ["/api/token", "/api/token/"] * 6
    ]
    assert codes[:10] == [401] * 10 and codes[10:] == [429, 429]
    refresh = [
        client.post("/api/token/refresh", {"refresh": "x"}, format="json") for _ in range(20)
    ]
    assert refresh[-1].status_code == 429, [r.status_code for r in refresh]
    assert refresh[-1].json()["error"]["code"] == "throttled"


def test_guessing_many_usernames_from_one_address_meets_a_429(login_limits):
    client = APIClient()
    codes = [
        client.post(
            "/api/token/", {"username": f"nobody{i}", "password": "x"}, format="json"
        ).status_code
        for i in range(31)
    ]
    assert codes[:30] == [401] * 30 and codes[30] == 429


def test_another_spelling_of_a_username_counts_against_the_same_account(login_limits, make_users):
    """The database matches names as its collation does (MariaDB: case, accents, width and
    invisible characters aside; the views trim spaces): each spelling reaches the same account,
    so none gets a limit of its own, nor does a JSON body sent as `*/*` (which the API's parser
    takes as JSON)."""
    (user,) = make_users(1, prefix="Alice")
    user.set_password("right-pass-123")
    user.save()
    name = user.username
    client = APIClient()
    for _ in range(10):
        wrong = {"username": name, "password": "wrong"}
        assert client.post("/api/token/", wrong, format="json").status_code == 401
    spellings = [f"{name} ", f" {name}\t", name.upper(), name.replace("A", "Á"), f"{name}\u200b"]
    spellings.append(name.translate({ord(c): ord(c) + 0xFEE0 for c in name}))  # fullwidth
    spellings.append(name + "\u200b" * 400)  # ignored however many, beyond any name's length
    for spelling in spellings:
        right = {"username": spelling, "password": "right-pass-123"}
        response = client.post("/api/token/", right, format="json")
        assert response.status_code == 429, (spelling[:20], response.content)
    body = json.dumps({"username": name, "password": "right-pass-123"})
    for content_type in ("*/*", "application/*"):
        response = client.post("/api/token/", body, content_type=content_type)
        assert response.status_code == 429, (content_type, response.content)
    form = f"username={name}&password=right-pass-123"
    for content_type in ("*/x-www-form-urlencoded", "application/x-www-form-urlencoded"):
        response = client.post("/api/token/", form, content_type=content_type)
        assert response.status_code == 429, (content_type, response.content)
    multipart = client.post("/api/token/", {"username": name, "password": "right-pass-123"})
    assert multipart.status_code == 429, multipart.content
    admin = client.post("/admin/login/", {"username": f"{name.upper()} ", "password": "x"})
    assert admin.status_code == 429


def test_attempts_are_charged_to_the_account_the_view_would_log_in(login_limits, make_users):
    """Two accounts whose names differ only by a character whose NFKC form is the other's
    (`𝐛` and `b`): the API logs in the name as given, the admin's form its NFKC form; each
    path's attempts count against the account that path would log in, never the other."""
    plain, styled = make_users(2, prefix="nfkc")
    plain.username, styled.username = "nfkc_b", "nfkc_\U0001d41b"  # the second: 𝐛
    for user in (plain, styled):
        user.set_password("right-pass-123")
        user.save()
    client = APIClient()
    for _ in range(10):
        wrong = {"username": styled.username, "password": "wrong"}
        assert client.post("/api/token/", wrong, format="json").status_code == 401
    right = {"username": styled.username, "password": "right-pass-123"}
    assert client.post("/api/token/", right, format="json").status_code == 429
    right["username"] = plain.username
    assert client.post("/api/token/", right, format="json").status_code == 200


def test_a_number_for_a_name_counts_as_its_text(login_limits, make_users):
    """DRF's CharField takes 13800138000 as "13800138000": so does the count."""
    (user,) = make_users(1)
    user.username = "13800138000"
    user.set_password("right-pass-123")
    user.save()
    client = APIClient()
    for _ in range(10):
        wrong = {"username": 13800138000, "password": "wrong"}
        assert client.post("/api/token/", wrong, format="json").status_code == 401
    right = {"username": 13800138000, "password": "right-pass-123"}
    assert client.post("/api/token/", right, format="json").status_code == 429
    right["username"] = "13800138000"
    assert client.post("/api/token/", right, format="json").status_code == 429


def test_a_name_of_no_account_is_counted_folded(login_limits):
    client = APIClient()
    for _ in range(10):
        guess = {"username": "Ghost", "password": "x"}
        assert client.post("/api/token/", guess, format="json").status_code == 401
    for spelling in ("ghost", " GHOST ", "Ghóst", "gh\u200bost"):
        guess = {"username": spelling, "password": "x"}
        assert client.post("/api/token/", guess, format="json").status_code == 429, spelling


def test_a_name_like_an_account_key_is_not_that_account(login_limits, make_users):
    """Names and accounts are counted apart: failing as `id:<pk>` does not lock user <pk>."""
    (user,) = make_users(1)
    user.set_password("right-pass-123")
    user.save()
    client = APIClient()
    for _ in range(11):
        client.post("/api/token/", {"username": f"id:{user.pk}", "password": "x"}, format="json")
    right = {"username": user.username, "password": "right-pass-123"}
    assert client.post("/api/token/", right, format="json").status_code == 200


def test_the_admin_login_is_limited_too(login_limits, client):
    get_user_model().objects.create_superuser("boss", "boss@example.com", "right-pass-123")
    for _ in range(10):
        page = client.post("/admin/login/", {"username": "boss", "password": "wrong"})
        assert page.status_code == 200  # the form again, with its error
    refused = client.post("/admin/login/", {"username": "boss", "password": "right-pass-123"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1


def test_the_login_paths_are_known_before_the_first_request():
    """A server's first POSTs (a burst of grabs, each asking whether it is a login) find the
    login paths already reversed as the server loaded, not each reversing them at once."""
    from django.core.handlers.wsgi import WSGIHandler

    from redpack.api import middleware

    middleware._credential_paths.cache_clear()
    WSGIHandler()  # what a gunicorn worker builds as it loads the application
    assert middleware._credential_paths.cache_info().currsize == 1
    assert "/api/token/" in middleware._credential_paths("/")


@pytest.mark.parametrize(
    ("strategy", "in_script"),
    [
        ("pessimistic", True),  # counted by the gate, before the strategy
        ("redis_queue_async", True),  # counted by the grab script (GrabStrategy.carries_checks)
        ("redis_counter", True),
        ("redis_counter", False),
        ("group_commit", True),  # counted by the batch's checks (request_checks.check_all)
        ("group_commit", False),
    ],
)
def test_a_burst_gets_exactly_its_rate_through(strategy, in_script, settings, sender, make_users):
    settings.REDPACK_THROTTLE_RATES = {"grab": "10/min", "send": None}
    settings.REDPACK_GRAB_CHECKS_IN_SCRIPT = in_script
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy=strategy
    )
    (user,) = make_users(1)
    token = str(AccessToken.for_user(user))
    codes: list[int] = []
    start = threading.Barrier(40)

    def click() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        start.wait()
        try:
            codes.append(client.post(f"/api/activities/{activity.pk}/grab/").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(codes) == 40
    assert codes.count(429) == 30  # ten through, not one more
    assert codes.count(200) == 10  # one grabbed, nine already_grabbed


@pytest.mark.parametrize("strategy", ["pessimistic", "group_commit"])
def test_with_redis_away_a_mysql_strategy_still_answers(strategy, settings, sender, make_users):
    """group_commit's own checks get no answer: the view makes them as the gate does."""
    settings.REDPACK_THROTTLE_RATES = {"grab": "10/min", "send": None}
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy=strategy
    )
    (user,) = make_users(1)
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": CLOSED}}
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
    answers = [client.post(f"/api/activities/{activity.pk}/grab/") for _ in range(12)]
    assert answers[0].json()["outcome"] == "grabbed"
    assert [a.status_code for a in answers] == [200] * 10 + [429] * 2  # counted in-process


@pytest.mark.parametrize(
    ("strategy", "script", "counted_here"),
    [
        # The gate's one script run (ratelimit.count_and_read) loses its reply: the request is
        # answered as with Redis away (counted in this process, the ban asked again).
        ("pessimistic", "count_and_read", 2),
        # group_commit's batch checks (lua/check_requests.lua) lose their reply: nothing was
        # taken, and the view makes the checks itself (the gate, in Redis) and grabs again.
        ("group_commit", "check_requests", 0),
    ],
)
def test_a_lost_reply_of_the_checks_is_answered_and_a_ban_still_holds(
    strategy, script, counted_here, settings, sender, make_users, redis_proxy
):
    """Never a 500, never a grab for the banned user, one for the allowed one."""
    settings.REDPACK_THROTTLE_RATES = {"grab": "10/min", "send": None}
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy=strategy
    )
    allowed, banned = make_users(2)
    banned.is_active = False
    banned.save()  # into the bans set (redpack/bans.py), as an admin's change does
    bans.forget()  # as in another web process: only Redis knows of the ban
    lost_sha = gate_script(script).sha.encode()

    answers = []
    for user in (allowed, banned):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
        redis_proxy.drop_reply(lost_sha)
        answers.append(client.post(f"/api/activities/{activity.pk}/grab/"))

    assert answers[0].status_code == 200 and answers[0].json()["outcome"] == "grabbed"
    assert answers[1].status_code == 401
    assert answers[1].json()["error"]["code"] == "user_inactive"
    assert redis_proxy.fired == 2  # both requests' checks lost their reply
    assert len(ratelimit._local.counts) == counted_here  # a lost gate count made again here
    assert GrabDetail.objects.filter(activity=activity).count() == 1


def window_count(user_id: int) -> int:
    """The grab throttle window's count in Redis (10/min, the tests' rate)."""
    key = ratelimit.window("grab", str(user_id), ratelimit.Rate(10, 60), ratelimit.clock()).key
    return int(get_redis_connection("default").get(key) or 0)


@pytest.mark.parametrize(
    ("strategy", "in_script"),
    [("redis_queue", True), ("group_commit", True), ("pessimistic", False)],
)
def test_a_window_found_over_answers_429_from_memory(
    strategy, in_script, settings, sender, make_users
):
    """Once this process has found a user's window over its limit, the user's further grabs in
    it are answered 429 without a count or a strategy; a limit raised past the count found lets
    the next one through, and a ban is still answered first (401)."""
    settings.REDPACK_THROTTLE_RATES = {"grab": "10/min", "send": None}
    settings.REDPACK_GRAB_CHECKS_IN_SCRIPT = in_script
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy=strategy
    )
    user, other = make_users(2)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
    grab = f"/api/activities/{activity.pk}/grab/"

    codes = [client.post(grab).status_code for _ in range(11)]
    assert codes == [200] * 10 + [429]
    assert window_count(user.pk) == 11  # the eleventh was counted, and found over
    later = [client.post(grab) for _ in range(5)]
    assert [answer.status_code for answer in later] == [429] * 5
    assert {answer.json()["error"]["code"] for answer in later} == {"throttled"}
    assert all(int(answer["Retry-After"]) >= 1 for answer in later)
    assert window_count(user.pk) == 11  # answered from memory, not counted

    settings.REDPACK_THROTTLE_RATES = {"grab": "12/min", "send": None}
    assert client.post(grab).status_code == 200  # counted again: 12, within the new limit
    assert window_count(user.pk) == 12

    other_client = APIClient()
    other_client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(other)}")
    assert other_client.post(grab).status_code == 200  # another user's window: its own
    user.is_active = False
    user.save()  # into the bans set (redpack/bans.py)
    bans.forget()  # this process's copy of the set read again (at most REDPACK_BANS_LOCAL_SECONDS)
    settings.REDPACK_THROTTLE_RATES = {"grab": "10/min", "send": None}
    refused = client.post(grab)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "user_inactive"
    assert GrabDetail.objects.filter(activity=activity).count() == 2


@pytest.mark.parametrize(
    ("strategy", "in_script"), [("redis_counter", True), ("pessimistic", False)]
)
def test_a_client_past_its_limit_is_one_line_per_window(
    strategy, in_script, settings, sender, make_users, caplog
):
    """The `throttled` event once, when this process first finds the window over; not Django's
    WARNING for each 429 (a client that keeps sending would write one per request)."""
    settings.REDPACK_THROTTLE_RATES = {"grab": "10/min", "send": None}
    settings.REDPACK_GRAB_CHECKS_IN_SCRIPT = in_script
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy=strategy
    )
    (user,) = make_users(1)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
    caplog.set_level(logging.INFO)
    codes = [client.post(f"/api/activities/{activity.pk}/grab/").status_code for _ in range(15)]
    assert codes == [200] * 10 + [429] * 5
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == "throttled"]
    assert line.levelno == logging.WARNING
    assert (line.scope, line.count, line.limit) == ("grab", 11, 10)  # type: ignore[attr-defined]
    assert line.window.startswith(f"rp:rate:grab:{user.pk}:")  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if getattr(r, "status_code", None) == 429]
