"""Lost replies and in-doubt commits on the Redis strategies (and `group_commit`, where they share
its write), through a fault-injecting TCP proxy in front of the real Redis or MariaDB
(tests/faults.py): a grab is never invented, stranded in Redis or lost, and a user never ends
up with two rows."""

import threading
from decimal import Decimal

import MySQLdb
import pytest
from django.conf import settings as django_settings
from django.db import connection
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import AccessToken

from redpack import services
from redpack.audit import audit_activity
from redpack.errors import OutcomeUnknown
from redpack.models import Activity, GrabDetail
from redpack.money import to_cents
from strategies import registry, turns
from strategies.base import GrabResult, Outcome
from strategies.lua import redis_client, script
from strategies.redis_state import RedisStateStrategy
from strategies.redis_state.keys import new_attempt
from tests import servers
from tests.faults import FaultProxy

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_STRATEGIES = ["redis_counter", "redis_queue", "redis_queue_single", "redis_queue_async"]
SYNC = ["redis_counter", "redis_queue", "redis_queue_single"]  # they write MySQL before they answer


def send(sender, strategy: str, count: int = 3) -> Activity:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk, total_amount=Decimal("3.00"), total_count=count, strategy=strategy
    )


def settled_rows(activity: Activity) -> dict[int, int]:
    """user -> cents in MySQL, once every acknowledged grab reached it."""
    assert registry.get(activity.strategy).settle(activity_id=activity.pk, timeout=10)
    return {
        row.user_id: to_cents(row.amount) for row in GrabDetail.objects.filter(activity=activity)
    }


def assert_consistent(activity: Activity) -> None:
    activity.refresh_from_db()
    report = audit_activity(activity)
    assert report.ok, report.violations


def grab_script_sha(strategy: str) -> bytes:
    """What identifies a grab's EVALSHA on the wire: every Redis strategy runs lua/grab.lua."""
    return script("grab").sha.encode()


@pytest.mark.parametrize("strategy", REDIS_STRATEGIES)
def test_a_lost_reply_is_settled_by_running_the_same_attempt_again(
    strategy, redis_proxy, make_users, sender
):
    activity = send(sender, strategy)
    user, other = make_users(2)
    redis_proxy.drop_reply(grab_script_sha(strategy))

    first = services.activity_grab(activity_id=activity.pk, user_id=user.pk)

    assert redis_proxy.fired == 1  # the script ran, its reply never came
    assert first.outcome is Outcome.GRABBED  # not already_grabbed: it is this attempt's grab
    again = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    assert (again.outcome, again.amount_cents) == (Outcome.ALREADY_GRABBED, first.amount_cents)
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=other.pk).outcome is Outcome.GRABBED
    )
    rows = settled_rows(activity)
    assert rows[user.pk] == first.amount_cents and len(rows) == 2
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", REDIS_STRATEGIES)
def test_replies_lost_for_good_answer_unknown_and_the_retry_converges(
    strategy, redis_proxy, make_users, sender
):
    activity = send(sender, strategy)
    (user,) = make_users(1)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
    runs = django_settings.REDPACK_REDIS_GRAB_RERUNS + 1
    redis_proxy.drop_reply(grab_script_sha(strategy), times=runs)

    response = client.post(f"/api/activities/{activity.pk}/grab/")

    assert redis_proxy.fired == runs
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "outcome_unknown"
    assert int(response["Retry-After"]) >= 1
    retry = client.post(f"/api/activities/{activity.pk}/grab/")
    assert retry.status_code == 200
    body = retry.json()
    # The grab the lost replies made is the one the user holds; the retry took no second one.
    assert body["outcome"] in {"grabbed", "already_grabbed"}
    rows = settled_rows(activity)
    assert rows == {user.pk: to_cents(Decimal(body["amount"]))}
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", SYNC)
def test_a_commit_whose_reply_was_lost_is_answered_grabbed(
    strategy, mysql_proxy, make_users, sender
):
    activity = send(sender, strategy)
    user, other = make_users(2)
    mysql_proxy.drop_reply(b"COMMIT")

    first = services.activity_grab(activity_id=activity.pk, user_id=user.pk)

    assert mysql_proxy.fired == 1
    assert first.outcome is Outcome.GRABBED  # committed: not given back to Redis
    assert settled_rows(activity) == {user.pk: first.amount_cents}
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=other.pk).outcome is Outcome.GRABBED
    )
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", SYNC)
def test_a_commit_that_never_reached_mysql_is_given_back(strategy, mysql_proxy, make_users, sender):
    activity = send(sender, strategy)
    (user,) = make_users(1)
    mysql_proxy.cut_before(b"COMMIT")

    first = services.activity_grab(activity_id=activity.pk, user_id=user.pk)

    assert mysql_proxy.fired == 1
    assert first.outcome is Outcome.CONTENDED  # nothing granted, and Redis has it back
    assert settled_rows(activity) == {}
    assert_consistent(activity)
    retry = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    assert retry.outcome is Outcome.GRABBED
    assert settled_rows(activity) == {user.pk: retry.amount_cents}
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", [*SYNC, "group_commit"])
def test_a_write_mysql_runs_after_the_client_gave_up_on_it_is_what_the_grab_answers(
    strategy, mysql_proxy, make_users, sender
):
    """The connection drops before MySQL has read the grab's last query, the one with COMMIT
    (still in flight on the network: the proxy holds it), and MySQL runs it later. The grab asks
    MySQL what it holds behind the activity's row lock (steps.written_row), which its
    transaction holds when it sends that query: the question waits for the write, and the
    answer is the row."""
    activity = send(sender, strategy)
    (user,) = make_users(1)
    mysql_proxy.hold(b"; COMMIT")  # the query that ends the grab's transaction
    answers: list[object] = []

    def grab() -> None:
        try:
            answers.append(services.activity_grab(activity_id=activity.pk, user_id=user.pk))
        except Exception as exc:  # noqa: BLE001 - an error is an answer too
            answers.append(exc)
        finally:
            connection.close()

    grabber = threading.Thread(target=grab)
    grabber.start()
    servers.wait_for(mysql_proxy.holds_a_request, "the grab's last query, held")
    servers.wait_for(
        lambda: not grabber.is_alive() or lock_waits(mysql_proxy) > 0,
        "the grab's answer, or its question to MySQL waiting for the row",
    )
    mysql_proxy.let_held_through()
    grabber.join(60)

    assert not grabber.is_alive()
    rows = settled_rows(activity)
    assert answers == [GrabResult(Outcome.GRABBED, rows[user.pk])]
    assert_consistent(activity)


def lock_waits(proxy: FaultProxy) -> int:
    """Locking reads of this test's database waiting for a lock, asked past the proxy."""
    db = connection.settings_dict
    host, port = proxy.target
    direct = MySQLdb.connect(host=host, port=port, user=db["USER"], password=db["PASSWORD"])
    try:
        cursor = direct.cursor()
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX t"
            " JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id"
            " WHERE t.trx_state = 'LOCK WAIT' AND p.DB = %s AND t.trx_query LIKE %s",
            [db["NAME"], "%FOR UPDATE%"],
        )
        return int(cursor.fetchone()[0])
    finally:
        direct.close()


def test_the_outcome_stays_unknown_while_mysql_cannot_be_asked(mysql_proxy, make_users, sender):
    activity = send(sender, "redis_counter")
    (user,) = make_users(1)
    mysql_proxy.drop_reply(b"COMMIT", then_cut=True)

    with pytest.raises(OutcomeUnknown):
        services.activity_grab(activity_id=activity.pk, user_id=user.pk)

    mysql_proxy.restore()
    retry = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    # The commit landed: the retry finds the row (and the mark Redis kept) and answers with it.
    assert retry.outcome is Outcome.ALREADY_GRABBED
    assert settled_rows(activity) == {user.pk: retry.amount_cents}
    assert_consistent(activity)


class StalledFirstClick:
    """A user's first click, in a thread of its own, stalled between Redis and MySQL (its grab
    script ran, its write waits) until `go()`; then its answer, or its error, in `answers`."""

    def __init__(self, monkeypatch, activity: Activity, user) -> None:  # type: ignore[no-untyped-def]
        self.won, self.released = threading.Event(), threading.Event()
        self.answers: dict[str, object] = {}
        write = RedisStateStrategy.write

        def first_waits(strategy, *args, **kwargs):  # type: ignore[no-untyped-def]
            if not self.won.is_set():
                self.won.set()
                assert self.released.wait(60)
            return write(strategy, *args, **kwargs)

        def first_click() -> None:
            try:
                self.answers["first"] = services.activity_grab(
                    activity_id=activity.pk, user_id=user.pk
                )
            except Exception as exc:  # noqa: BLE001 - an error is an answer too
                self.answers["first_error"] = exc
            finally:
                connection.close()

        monkeypatch.setattr(RedisStateStrategy, "write", first_waits)
        self.thread = threading.Thread(target=first_click)
        self.thread.start()
        assert self.won.wait(30)

    def go(self) -> None:
        self.released.set()
        self.thread.join(60)


@pytest.mark.parametrize("commit", ["reaches MySQL", "is cut"])
@pytest.mark.parametrize("strategy", SYNC)
def test_a_stalled_first_click_does_not_let_the_answers_part(
    strategy, commit, monkeypatch, mysql_proxy, make_users, sender
):
    """The first click stalls between Redis and MySQL longer than a double click waits for it;
    the double click (another process: a strategy instance of its own, so another combiner)
    takes the mark over and writes the row. Whatever the first click's write then does (its
    COMMIT reaches MySQL or is cut), one row, and the answers agree with it: the first click,
    if it answers, is the one told `grabbed`."""
    activity = send(sender, strategy)
    (user,) = make_users(1)
    first = StalledFirstClick(monkeypatch, activity, user)
    answers = first.answers
    other_process = type(registry.get(strategy))()
    double = other_process.grab(activity_id=activity.pk, user_id=user.pk)  # waits, adopts
    if commit == "is cut":
        mysql_proxy.cut_before(b"COMMIT")  # the first click's write
    first.go()

    assert double.outcome is Outcome.ALREADY_GRABBED
    assert settled_rows(activity) == {user.pk: double.amount_cents}
    if commit == "reaches MySQL":
        assert "first" in answers
    if "first" in answers:
        assert answers["first"] == GrabResult(Outcome.GRABBED, double.amount_cents)
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", SYNC)
def test_a_double_click_whose_own_write_is_cut_keeps_the_stalled_first_clicks_mark(
    strategy, monkeypatch, mysql_proxy, make_users, sender
):
    """The first click stalls between Redis and MySQL; the double click (another process)
    takes its mark over, and its own write is cut before its COMMIT: MySQL holds no row, yet
    the first click may still write the grab. So the double click keeps the mark (503) rather
    than give the packet back, the first click's write lands, and Redis and MySQL agree."""
    activity = send(sender, strategy)
    (user,) = make_users(1)
    first = StalledFirstClick(monkeypatch, activity, user)
    other_process = type(registry.get(strategy))()
    mysql_proxy.cut_before(b"COMMIT")  # the double click's write
    try:
        with pytest.raises(OutcomeUnknown):
            other_process.grab(activity_id=activity.pk, user_id=user.pk)  # waits, adopts
        assert mysql_proxy.fired == 1
    finally:
        first.go()
    answer = first.answers["first"]
    assert isinstance(answer, GrabResult) and answer.outcome is Outcome.GRABBED
    assert settled_rows(activity) == {user.pk: answer.amount_cents}
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", SYNC)
def test_an_adopter_whose_turn_never_comes_keeps_the_mark(
    strategy, monkeypatch, make_users, sender
):
    """A user's first attempt made its grab in Redis and is still writing it (its write holds
    the activity's turn in this process, its COMMIT on its way); the retry takes the mark over
    and waits for the turn in vain. It sent nothing, but the earlier write may still commit:
    giving the packet back would let Redis give it twice. Outcome unknown, the mark kept, and
    the next retry writes the one grab."""
    activity = send(sender, strategy)
    (user,) = make_users(1)
    chosen = registry.get(strategy)
    assert isinstance(chosen, RedisStateStrategy)
    assert chosen.run_grab(activity.pk, user.pk, new_attempt()).outcome == "grabbed"  # the first
    retry = new_attempt()
    seen = chosen.run_grab(activity.pk, user.pk, retry)  # the retry finds the first one's mark
    assert seen.outcome == "already_grabbed"
    monkeypatch.setattr(turns, "WAIT_SECONDS", 0.2)
    holding, done = threading.Event(), threading.Event()

    def first_attempts_write() -> None:
        with turns.turn(activity.pk):
            holding.set()
            assert done.wait(60)

    first = threading.Thread(target=first_attempts_write)
    first.start()
    assert holding.wait(30)
    try:
        with pytest.raises(OutcomeUnknown):
            chosen.adopt(activity.pk, user.pk, seen, retry)
    finally:
        done.set()
        first.join(60)
    assert settled_rows(activity) == {}
    again = services.activity_grab(activity_id=activity.pk, user_id=user.pk)  # adopts, writes
    assert again.outcome is Outcome.ALREADY_GRABBED
    assert settled_rows(activity) == {user.pk: again.amount_cents}
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", SYNC)
def test_a_grab_left_in_redis_only_is_reported_not_guessed(
    strategy, redis_proxy, make_users, sender
):
    """Replies lost for good and no retry: the auditor names the grab Redis holds without a
    MySQL row, until the user's retry writes it."""
    activity = send(sender, strategy)
    (user,) = make_users(1)
    redis_proxy.drop_reply(
        grab_script_sha(strategy), times=django_settings.REDPACK_REDIS_GRAB_RERUNS + 1
    )
    with pytest.raises(OutcomeUnknown):
        services.activity_grab(activity_id=activity.pk, user_id=user.pk)

    activity.refresh_from_db()
    violations = " ".join(audit_activity(activity).violations)
    assert f"user {user.pk} has nothing in MySQL but" in violations
    retry = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    assert retry.outcome is Outcome.ALREADY_GRABBED  # the grab the lost replies made
    assert settled_rows(activity) == {user.pk: retry.amount_cents}
    assert_consistent(activity)


def test_the_redis_client_has_the_timeouts_and_resends_nothing():
    client = redis_client()
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["retry"].get_retries() == 0  # no blind re-send of a grab script
    assert kwargs["socket_timeout"] == django_settings.REDIS_SOCKET_TIMEOUT
    assert kwargs["socket_connect_timeout"] == django_settings.REDIS_CONNECT_TIMEOUT
