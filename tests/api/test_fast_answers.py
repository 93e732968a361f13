"""The grab request's own cost (issue: every request answered, fast): one Redis round trip before
the strategy, or none where the strategy carries the request's checks; no MySQL query of its
own, no browser middleware; a sold-out or closed activity answered from memory; a full line
answered at once with 409 `shed`."""

import threading
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django_redis import get_redis_connection
from redis.client import Pipeline
from redis.connection import AbstractConnection
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import AccessToken

from redpack import finished, services, shedding
from strategies.base import GrabResult, Outcome
from strategies.lua import gate_script, script
from tests.dummy_strategies import DUMMIES, HeldStrategy

pytestmark = pytest.mark.django_db(transaction=True)


def client_of(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
    return client


def send(sender, strategy: str, count: int = 2) -> int:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk, total_amount=f"{count}.00", total_count=count, strategy=strategy
    ).pk


@pytest.fixture
def redis_round_trips(monkeypatch) -> Iterator[list[str]]:  # type: ignore[no-untyped-def]
    """Every round trip to Redis, on a pool's connection or a thread's own: a command (a script
    run by the name of its script, the requests' gate script as `count_and_read`) or a
    pipeline."""
    trips: list[str] = []
    command, execute = AbstractConnection.send_command, Pipeline.execute

    def counted_command(self, *args, **options):  # type: ignore[no-untyped-def]
        name = str(args[0])
        if name == "EVALSHA" and args[1] == gate_script("count_and_read").sha:
            name = "EVALSHA count_and_read"
        elif name == "EVALSHA":
            name = f"EVALSHA {args[1]}"
        trips.append(name)
        return command(self, *args, **options)

    def counted_execute(self, *args, **options):  # type: ignore[no-untyped-def]
        trips.append("pipeline: " + " ".join(str(c[0][0]) for c in self.command_stack))
        return execute(self, *args, **options)

    monkeypatch.setattr(AbstractConnection, "send_command", counted_command)
    monkeypatch.setattr(Pipeline, "execute", counted_execute)
    with override_settings(
        REDPACK_THROTTLE_RATES={**settings.REDPACK_THROTTLE_RATES, "grab": "120/min"}
    ):
        yield trips


@pytest.mark.parametrize("strategy", ["pessimistic", "group_commit", "redis_queue"])
def test_after_the_last_packet_grabs_are_answered_without_mysql(strategy, make_users, sender):
    users = make_users(4)
    activity = send(sender, strategy)
    first, second, late, later = (client_of(u) for u in users)
    assert first.post(f"/api/activities/{activity}/grab/").json()["outcome"] == "grabbed"
    won = second.post(f"/api/activities/{activity}/grab/").json()
    assert won["outcome"] == "grabbed"
    assert late.post(f"/api/activities/{activity}/grab/").json() == {"outcome": "sold_out"}

    with CaptureQueriesContext(connection) as queries:
        answers = [
            later.post(f"/api/activities/{activity}/grab/").json(),
            # a holder hears what it holds, in the contract's order, from the same memory
            second.post(f"/api/activities/{activity}/grab/").json(),
            later.post(f"/api/activities/{activity}/grab/").json(),
        ]
    held = {"outcome": "already_grabbed", "amount": won["amount"]}
    assert answers == [{"outcome": "sold_out"}, held, {"outcome": "sold_out"}]
    # The holders are read once for the process's memory, then nothing.
    assert len(queries) <= 1, [q["sql"] for q in queries]


def test_another_process_learns_the_end_from_redis_in_the_same_round_trip(
    make_users, sender, redis_round_trips
):
    users = make_users(3)
    activity = send(sender, "pessimistic", count=1)
    assert client_of(users[0]).post(f"/api/activities/{activity}/grab/").json()["outcome"] == (
        "grabbed"
    )
    assert client_of(users[1]).post(f"/api/activities/{activity}/grab/").status_code == 200
    finished.forget()  # this process forgets; Redis still says sold out
    redis_round_trips.clear()

    with CaptureQueriesContext(connection) as queries:
        answer = client_of(users[2]).post(f"/api/activities/{activity}/grab/")
    assert answer.json() == {"outcome": "sold_out"}
    assert redis_round_trips == ["EVALSHA count_and_read"]
    assert len(queries) == 1  # the holders, read once for this process's memory


def test_a_grab_makes_one_redis_round_trip_before_its_strategy(
    make_users, sender, redis_round_trips
):
    (user,) = make_users(1)
    activity = send(sender, "pessimistic")  # a MySQL strategy: nothing else asks Redis
    # This thread's own connection made, and the gate's script loaded, as in a running server.
    assert client_of(user).get("/api/ping/").status_code == 200
    redis_round_trips.clear()
    with CaptureQueriesContext(connection) as queries:
        response = client_of(user).post(f"/api/activities/{activity}/grab/")
    assert response.json()["outcome"] == "grabbed"
    assert redis_round_trips == ["EVALSHA count_and_read"]
    # pessimistic's own statements only: no session, no user row, no strategy lookup twice
    assert all("auth_user" not in q["sql"] and "django_session" not in q["sql"] for q in queries)
    assert "Set-Cookie" not in response and "Cookie" not in response.get("Vary", "")


CARRYING = ["redis_queue", "redis_queue_async", "redis_counter", "redis_queue_single"]


@pytest.mark.parametrize("strategy", [*CARRYING, "group_commit"])
def test_a_strategy_that_carries_the_checks_gets_no_round_trip_before_it(
    strategy, make_users, sender, redis_round_trips
):
    """No round trip before the strategy: the ban and throttle go in the grab script's run
    (group_commit: in one script run for its batch, before the transaction)."""
    (user,) = make_users(1)
    activity = send(sender, strategy)
    grab_script = (
        gate_script("check_requests").sha if strategy == "group_commit" else script("grab").sha
    )
    assert client_of(user).get("/api/ping/").status_code == 200  # as in a running server
    assert client_of(user).get(f"/api/activities/{activity}/").status_code == 200
    redis_round_trips.clear()
    with CaptureQueriesContext(connection) as queries:
        response = client_of(user).post(f"/api/activities/{activity}/grab/")
    assert response.json()["outcome"] == "grabbed"
    assert redis_round_trips[0] == f"EVALSHA {grab_script}"
    assert "EVALSHA count_and_read" not in redis_round_trips
    assert all("auth_user" not in q["sql"] for q in queries)


def test_the_checks_go_before_the_script_when_turned_off(
    settings, make_users, sender, redis_round_trips
):
    settings.REDPACK_GRAB_CHECKS_IN_SCRIPT = False
    (user,) = make_users(1)
    activity = send(sender, "redis_queue_async")
    assert client_of(user).get("/api/ping/").status_code == 200
    redis_round_trips.clear()
    assert client_of(user).post(f"/api/activities/{activity}/grab/").status_code == 200
    assert redis_round_trips[0] == "EVALSHA count_and_read"


@pytest.mark.parametrize("strategy", ["pessimistic", "redis_counter"])
def test_once_known_finished_a_grab_asks_neither_redis_nor_mysql_nor_the_throttle(
    strategy, make_users, sender, redis_round_trips
):
    """The hot burst's sold-out answers: from this process's memory, the ban from its copy of
    the set (redpack/bans.py), no round trip at all, and not counted by the throttle (each
    costs less than the count would): a user past the grab rate still hears sold_out."""
    users = make_users(3)
    activity = send(sender, strategy, count=1)
    assert client_of(users[0]).post(f"/api/activities/{activity}/grab/").status_code == 200
    late = client_of(users[1])
    assert late.post(f"/api/activities/{activity}/grab/").json() == {"outcome": "sold_out"}
    assert late.post(f"/api/activities/{activity}/grab/").json() == {"outcome": "sold_out"}
    redis_round_trips.clear()  # the memory's holders and the bans' copy are read by now

    with CaptureQueriesContext(connection) as queries:
        for _ in range(130):  # past the grab rate of 120/min
            assert late.post(f"/api/activities/{activity}/grab/").json() == {"outcome": "sold_out"}
        assert client_of(users[0]).post(f"/api/activities/{activity}/grab/").json()["outcome"] == (
            "already_grabbed"
        )
    assert redis_round_trips == []
    assert len(queries) == 0


def test_another_method_on_the_grab_path_of_an_ended_activity_is_405_not_an_answer(
    make_users, sender, monkeypatch
):
    users = make_users(2)
    activity = send(sender, "redis_counter", count=1)
    assert client_of(users[0]).post(f"/api/activities/{activity}/grab/").status_code == 200
    late = client_of(users[1])
    assert late.post(f"/api/activities/{activity}/grab/").json() == {"outcome": "sold_out"}
    asked: list[int] = []
    answered = services.grab_answered_from_memory
    monkeypatch.setattr(
        services,
        "grab_answered_from_memory",
        lambda **kw: asked.append(kw["activity_id"]) or answered(**kw),
    )
    for method in (late.get, late.put, late.delete):
        assert method(f"/api/activities/{activity}/grab/").status_code == 405
    assert asked == []  # not answered from memory, so not counted as a grab answered
    assert late.post(f"/api/activities/{activity}/grab/").json() == {"outcome": "sold_out"}
    assert asked == [activity]


def test_a_closed_activity_is_answered_closed_from_memory_even_to_a_holder(make_users, sender):
    users = make_users(2)
    activity = send(sender, "pessimistic")
    assert client_of(users[0]).post(f"/api/activities/{activity}/grab/").status_code == 200
    services.activity_expire(activity_id=activity, force=True)
    assert client_of(users[1]).post(f"/api/activities/{activity}/grab/").json() == {
        "outcome": "closed"
    }
    with CaptureQueriesContext(connection) as queries:
        assert client_of(users[0]).post(f"/api/activities/{activity}/grab/").json() == {
            "outcome": "closed"
        }
    assert len(queries) == 0


def test_the_memory_expires_and_the_strategy_answers_again(make_users, sender, monkeypatch):
    users = make_users(2)
    activity = send(sender, "pessimistic", count=1)
    client_of(users[0]).post(f"/api/activities/{activity}/grab/")
    assert client_of(users[1]).post(f"/api/activities/{activity}/grab/").json() == {
        "outcome": "sold_out"
    }
    now = finished.clock()
    monkeypatch.setattr(finished, "clock", lambda: now + settings.REDPACK_FINISHED_SECONDS + 1)
    get_redis_connection("default").delete(finished.key(activity))  # expired there too
    with CaptureQueriesContext(connection) as queries:
        again = client_of(users[1]).post(f"/api/activities/{activity}/grab/").json()
    assert again == {"outcome": "sold_out"}
    assert any("FOR UPDATE" in q["sql"] for q in queries)  # pessimistic's row lock, asked again


def test_past_half_its_life_one_request_renews_the_memory_and_the_others_are_answered_from_it(
    make_users, sender, monkeypatch
):
    """In a burst the memory never ends under the requests: one of them asks the strategy again
    (pessimistic's row lock), the others are still answered from memory, and the strategy's
    sold_out keeps the memory and the flag for a whole period more."""
    users = make_users(4)
    activity = send(sender, "pessimistic", count=1)
    client_of(users[0]).post(f"/api/activities/{activity}/grab/")
    assert client_of(users[1]).post(f"/api/activities/{activity}/grab/").json() == {
        "outcome": "sold_out"
    }
    seconds = settings.REDPACK_FINISHED_SECONDS
    due = finished._seen[activity].renew_from
    assert due < finished._seen[activity].until
    monkeypatch.setattr(finished, "clock", lambda: due)
    flag = finished.key(activity)
    get_redis_connection("default").pexpire(flag, 50)  # the flag near its end, as the memory

    answers, locked = [], []
    for user in users[1:]:
        with CaptureQueriesContext(connection) as queries:
            answers.append(client_of(user).post(f"/api/activities/{activity}/grab/").json())
        locked.append(any("FOR UPDATE" in q["sql"] for q in queries))
    assert answers == [{"outcome": "sold_out"}] * 3
    assert locked == [True, False, False]  # the first asked the strategy, the others did not
    assert finished._seen[activity].until == due + seconds
    assert finished._seen[activity].renew_asked == finished.NEVER  # a new memory
    flag_ms = get_redis_connection("default").pttl(flag)
    assert seconds * 1000 - 1000 < flag_ms <= seconds * 1000  # renewed for the others too


def test_a_renewing_request_whose_answer_is_not_final_lets_another_through_later(
    make_users, sender, monkeypatch
):
    """The user sent to renew holds a packet (the strategy answers already_grabbed, which says
    nothing of the end): the memory is not renewed, and after RENEW_RETRY_SHARE of the period
    the next request asks again."""
    holder, other = make_users(2)
    activity = send(sender, "pessimistic", count=1)
    assert client_of(holder).post(f"/api/activities/{activity}/grab/").json()["outcome"] == (
        "grabbed"
    )
    client_of(other).post(f"/api/activities/{activity}/grab/")
    seen = finished._seen[activity]
    until, due = seen.until, seen.renew_from
    monkeypatch.setattr(finished, "clock", lambda: due)
    assert finished.answer(activity, holder.pk) is None  # sent to the strategy
    finished.learn(activity, GrabResult(Outcome.ALREADY_GRABBED, 100))
    assert finished._seen[activity].until == until  # not renewed
    assert finished.answer(activity, other.pk) == GrabResult(Outcome.SOLD_OUT)  # from memory
    later = due + 1.01 * finished.RENEW_RETRY_SHARE * settings.REDPACK_FINISHED_SECONDS
    monkeypatch.setattr(finished, "clock", lambda: later)
    assert finished.answer(activity, other.pk) is None  # the next one asks


def test_a_grant_after_a_renewing_request_ends_the_sold_out_memory_and_its_flag(
    make_users, sender, monkeypatch
):
    """A packet given back: the request sent to renew the memory is granted, so the end was
    not final; the next requests ask the strategy. A grant learned before any renewal (the
    batch that sold out, its grants learned after its sold_out) ends nothing."""
    (user,) = make_users(1)
    activity = send(sender, "pessimistic")
    flag = finished.key(activity)
    finished.learn(activity, GrabResult(Outcome.SOLD_OUT))
    finished.learn(activity, GrabResult(Outcome.GRABBED, 100))  # same batch
    assert finished.known(activity)
    due = finished._seen[activity].renew_from
    monkeypatch.setattr(finished, "clock", lambda: due)
    assert finished.answer(activity, user.pk) is None  # sent to renew
    finished.learn(activity, GrabResult(Outcome.GRABBED, 100))
    assert not finished.known(activity)
    assert get_redis_connection("default").get(flag) is None
    finished.learn(activity, GrabResult(Outcome.CLOSED))
    finished._seen[activity].renew_asked = due
    finished.learn(activity, GrabResult(Outcome.GRABBED, 100))  # closed is never taken back
    assert finished.known(activity)
    assert get_redis_connection("default").get(flag) == b"closed"


def test_a_full_line_is_answered_at_once_409_shed_and_other_activities_are_not(make_users, sender):
    users = make_users(3)
    HeldStrategy.release.clear()
    with override_settings(
        REDPACK_STRATEGIES={**settings.REDPACK_STRATEGIES, **DUMMIES}, REDPACK_GRAB_LINE=1
    ):
        held = send(sender, "held")
        other = send(sender, "pessimistic")
        waiting = threading.Thread(
            target=client_of(users[0]).post, args=(f"/api/activities/{held}/grab/",)
        )
        waiting.start()
        try:
            assert HeldStrategy.entered.acquire(timeout=30)  # the first grab holds the line
            shed = client_of(users[1]).post(f"/api/activities/{held}/grab/")
            elsewhere = client_of(users[2]).post(f"/api/activities/{other}/grab/")
        finally:
            HeldStrategy.release.set()
            waiting.join()
    assert shed.status_code == 409
    assert shed.json() == {"outcome": "contended", "reason": "shed"}
    assert shed["Retry-After"] == str(settings.REDPACK_SHED_RETRY_AFTER)
    assert elsewhere.json()["outcome"] == "grabbed"


def test_optimistic_lets_one_grab_per_activity_try_at_a_time_in_a_web_process(make_users, sender):
    """Its line is REDPACK_OPTIMISTIC_LINE (1): with one grab of the activity under way in this
    process, the next web request is shed at once, a pessimistic activity's is not; once the
    first is done the next one grabs."""
    users = make_users(3)
    optimistic, pessimistic = send(sender, "optimistic"), send(sender, "pessimistic")
    line = settings.REDPACK_GRAB_LINE  # not bounded: the test's own places are never shed
    with (
        shedding.place(optimistic, line=line, bounded=False),
        shedding.place(pessimistic, line=line, bounded=False),
    ):
        shed = client_of(users[0]).post(f"/api/activities/{optimistic}/grab/")
        other = client_of(users[1]).post(f"/api/activities/{pessimistic}/grab/")
    assert shed.status_code == 409
    assert shed.json() == {"outcome": "contended", "reason": "shed"}
    assert other.json()["outcome"] == "grabbed"
    after = client_of(users[0]).post(f"/api/activities/{optimistic}/grab/")
    assert after.json()["outcome"] == "grabbed"


def test_a_late_sold_out_never_replaces_closed(make_users, sender):
    (user,) = make_users(1)
    activity = send(sender, "pessimistic")
    finished.learn(activity, GrabResult(Outcome.CLOSED))
    finished.learn(activity, GrabResult(Outcome.SOLD_OUT))  # a batch that finished late
    assert finished.answer(activity, user.pk) == GrabResult(Outcome.CLOSED)
    assert get_redis_connection("default").get(finished.key(activity)) == b"closed"
    finished.forget()  # another process, told sold_out by a stale flag, hears closed
    assert finished.answer(activity, user.pk, b"closed", 500) == GrabResult(Outcome.CLOSED)


def test_sold_out_is_answered_from_memory_only_once_every_grab_is_settled(
    make_users, sender, monkeypatch
):
    winner, writing, late = make_users(3)
    activity = send(sender, "redis_queue", count=1)
    assert services.activity_grab(activity_id=activity, user_id=winner.pk).outcome == (
        Outcome.GRABBED
    )
    # A grab taken in Redis whose row is still being written (its write may yet fail and give
    # the packet back): a mark without its row.
    grabbed = f"rp:{{{activity}}}:grabbed"
    get_redis_connection("default").hset(grabbed, writing.pk, "100|in-flight")
    finished.learn(activity, GrabResult(Outcome.SOLD_OUT))
    assert finished.answer(activity, late.pk) is None  # the strategy answers meanwhile

    get_redis_connection("default").hdel(grabbed, writing.pk)  # settled: given back, say
    now = finished.clock()
    monkeypatch.setattr(finished, "clock", lambda: now + finished.UNSETTLED_REREAD_SECONDS)
    assert finished.answer(activity, late.pk) == GrabResult(Outcome.SOLD_OUT)


def test_a_memory_learned_from_the_flag_lasts_no_longer_than_the_flag(
    make_users, sender, monkeypatch
):
    (user,) = make_users(1)
    activity = send(sender, "pessimistic")
    now = finished.clock()
    monkeypatch.setattr(finished, "clock", lambda: now)  # no time passes between the reads
    assert finished.answer(activity, user.pk, b"closed", 100) == GrabResult(Outcome.CLOSED)
    assert finished._seen[activity].until <= now + 0.1 + 1e-9
