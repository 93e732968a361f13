"""Batches beyond the contract (strategies/combiner.py joins concurrent grabs; here each batch is
composed by hand, so every run is the same): the same user twice in one batch, a batch spanning
the last packet, closed activities, a member MySQL refuses, MySQL failing mid-batch, a Redis
script error mid-batch. Real MariaDB and Redis; faults through tests/faults.py."""

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django_redis import get_redis_connection
from redis.exceptions import ResponseError

from redpack import services
from redpack.audit import audit_activity
from redpack.errors import Forbidden, OutcomeUnknown
from redpack.models import Activity, GrabDetail, Packet
from redpack.money import to_cents
from strategies import registry
from strategies.base import GrabResult, Outcome
from strategies.redis_state.keys import Keys, new_attempt
from strategies.steps import GrabTransaction
from tests import servers

pytestmark = pytest.mark.django_db(transaction=True)

BATCHED_REDIS = ["redis_queue", "redis_counter", "redis_queue_async"]
BATCHED = ["group_commit", *BATCHED_REDIS]
MISSING_USER = 2_000_000_000


def send(  # type: ignore[no-untyped-def]
    sender, strategy: str, count: int = 3, total: str = "3.00", **options
) -> Activity:
    return services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal(total),
        total_count=count,
        strategy=strategy,
        **options,
    )


def run_batch(strategy: str, activity_id: int, user_ids: list[int]) -> list[object]:
    """One batch of exactly these grabs, as the combiner's leader runs it."""
    chosen = registry.get(strategy)
    if strategy == "group_commit":
        return list(chosen.grab_batch(activity_id, user_ids))  # type: ignore[attr-defined]
    members = [(user_id, new_attempt(), "") for user_id in user_ids]
    return list(chosen.decide_batch(activity_id, members))  # type: ignore[attr-defined]


def rows_of(activity: Activity) -> dict[int, int]:
    assert registry.get(activity.strategy).settle(activity_id=activity.pk, timeout=30)
    return {d.user_id: to_cents(d.amount) for d in GrabDetail.objects.filter(activity=activity)}


def assert_consistent(activity: Activity) -> None:
    activity.refresh_from_db()
    report = audit_activity(activity)
    assert report.ok, report.violations


@pytest.mark.parametrize("strategy", BATCHED)
def test_the_same_user_twice_in_one_batch_gets_one_packet(strategy, make_users, sender):
    activity = send(sender, strategy)
    first, second = make_users(2)
    answers = run_batch(strategy, activity.pk, [first.pk, first.pk, second.pk])
    assert isinstance(answers[0], GrabResult) and answers[0].outcome is Outcome.GRABBED
    assert answers[1] == GrabResult(Outcome.ALREADY_GRABBED, answers[0].amount_cents)
    assert isinstance(answers[2], GrabResult) and answers[2].outcome is Outcome.GRABBED
    assert rows_of(activity) == {
        first.pk: answers[0].amount_cents,
        second.pk: answers[2].amount_cents,
    }
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", BATCHED)
def test_a_batch_spanning_the_last_packet_answers_the_rest_sold_out(strategy, make_users, sender):
    activity = send(sender, strategy, count=3, total="3.00")
    users = make_users(5)
    answers = run_batch(strategy, activity.pk, [u.pk for u in users])
    outcomes = [a.outcome for a in answers]  # type: ignore[attr-defined]
    assert outcomes == [Outcome.GRABBED] * 3 + [Outcome.SOLD_OUT] * 2
    assert sum(a.amount_cents for a in answers[:3]) == 300  # type: ignore[attr-defined]
    assert len(rows_of(activity)) == 3  # settled: in MySQL
    activity.refresh_from_db()
    assert activity.surplus_count == 0 and to_cents(activity.surplus_amount) == 0
    # A later member who already holds a packet hears so, not sold_out.
    again = run_batch(strategy, activity.pk, [users[4].pk, users[0].pk])
    assert again[0] == GrabResult(Outcome.SOLD_OUT)
    assert again[1] == GrabResult(Outcome.ALREADY_GRABBED, answers[0].amount_cents)  # type: ignore[attr-defined]
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", BATCHED)
def test_a_batch_after_close_answers_closed_and_writes_nothing(strategy, make_users, sender):
    activity = send(sender, strategy)
    users = make_users(3)
    registry.get(strategy).close(activity_id=activity.pk)
    answers = run_batch(strategy, activity.pk, [u.pk for u in users])
    assert answers == [GrabResult(Outcome.CLOSED)] * 3
    assert rows_of(activity) == {}


@pytest.mark.parametrize("strategy", ["group_commit", "redis_queue", "redis_counter"])
def test_a_member_mysql_refuses_gets_its_own_answer_and_the_others_their_packets(
    strategy, make_users, sender
):
    """A signed token outliving its user: the batch's INSERT fails on its foreign key; each
    member is then written on its own, and only that one is refused (403)."""
    activity = send(sender, strategy)
    first, second = make_users(2)
    answers = run_batch(strategy, activity.pk, [first.pk, MISSING_USER, second.pk])
    assert isinstance(answers[1], Forbidden)
    granted = [answers[0], answers[2]]
    assert all(isinstance(a, GrabResult) and a.outcome is Outcome.GRABBED for a in granted)
    assert rows_of(activity) == {
        first.pk: answers[0].amount_cents,  # type: ignore[union-attr]
        second.pk: answers[2].amount_cents,  # type: ignore[union-attr]
    }
    assert_consistent(activity)  # the refused member's packet went back to Redis


@pytest.mark.parametrize("strategy", ["group_commit", "redis_queue", "redis_counter"])
def test_a_batch_holds_the_activity_row_for_one_query_after_the_one_that_takes_it(
    strategy, make_users, sender
):
    """The query that commits carries the writes made after the row was taken
    (steps.GrabTransaction.commit_with_grabs): group_commit's lookup locks the row, then the
    surplus UPDATE, the INSERT and COMMIT go as one query; the Redis strategies' UPDATE takes
    the row, then the INSERT and COMMIT go as one query: two queries in all, redis_queue's
    claim of its packets in the first, ahead of the UPDATE. START TRANSACTION goes with the
    transaction's first statement, in its query."""
    activity = send(sender, strategy)
    users = make_users(2)
    with CaptureQueriesContext(connection) as queries:
        answers = run_batch(strategy, activity.pk, [u.pk for u in users])
    assert [a.outcome for a in answers] == [Outcome.GRABBED] * 2  # type: ignore[attr-defined]
    sql = [q["sql"] for q in queries.captured_queries]
    started = [q for q in sql if q.startswith("START TRANSACTION")]
    assert len(started) == 1 and started[0].startswith("START TRANSACTION; "), sql
    sql = [q.removeprefix("START TRANSACTION; ") for q in sql]
    activities, details = Activity._meta.db_table, GrabDetail._meta.db_table
    *before, took, last = sql
    assert f"INSERT INTO {details} " in last and last.endswith("; COMMIT"), sql
    assert "COMMIT" not in before + [took], sql
    if strategy == "group_commit":
        assert took.endswith("FOR UPDATE") and last.startswith(f"UPDATE {activities} "), sql
    else:
        claim, _, take = took.rpartition("; ")
        assert take.startswith(f"UPDATE {activities} ") and last.startswith("INSERT"), sql
        claims = claim.startswith(f"UPDATE {Packet._meta.db_table} p JOIN ")
        assert (claims, before) == (strategy == "redis_queue", []), sql
        assert f"{activities} " not in claim, sql  # the claim leaves the row free
    assert not any(f"{activities} " in q for q in before), sql  # the row is free until `took`
    assert rows_of(activity) == {u.pk: a.amount_cents for u, a in zip(users, answers, strict=True)}  # type: ignore[attr-defined]
    assert_consistent(activity)


@pytest.mark.parametrize(
    ("strategy", "lost"),
    [
        *[(strategy, b"COMMIT") for strategy in ["group_commit", "redis_queue", "redis_counter"]],
        ("redis_queue", b"SET surplus_count"),
        ("redis_counter", b"SET surplus_count"),
    ],
)
def test_a_batch_whose_write_lost_its_reply_is_answered_from_mysql(
    strategy, lost, mysql_proxy, make_users, sender
):
    """The reply to one of the batch's queries is lost and its connection dropped. COMMIT's:
    the whole batch committed, and every member hears what MySQL holds. The Redis strategies'
    first write's (the surplus UPDATE that takes the row, `redis_queue`'s claim of its packets
    before it in its query): MySQL rolls that transaction back with its connection, nothing of
    it committed, and each member is then written on its own, on a new connection."""
    activity = send(sender, strategy)
    users = make_users(2)
    connection.ensure_connection()
    mysql_proxy.drop_reply(lost)
    answers = run_batch(strategy, activity.pk, [u.pk for u in users])
    assert mysql_proxy.fired == 1
    assert [a.outcome for a in answers] == [Outcome.GRABBED] * 2  # type: ignore[attr-defined]
    assert rows_of(activity) == {u.pk: a.amount_cents for u, a in zip(users, answers, strict=True)}  # type: ignore[attr-defined]
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", ["group_commit", "redis_queue", "redis_counter"])
def test_a_batch_cut_before_commit_grants_nothing_it_did_not_write(
    strategy, mysql_proxy, make_users, sender
):
    activity = send(sender, strategy)
    users = make_users(2)
    connection.ensure_connection()
    mysql_proxy.cut_before(b"COMMIT")
    answers = run_batch(strategy, activity.pk, [u.pk for u in users])
    assert mysql_proxy.fired == 1
    rows = rows_of(activity)
    for user, answer in zip(users, answers, strict=True):
        assert isinstance(answer, GrabResult)
        if answer.outcome is Outcome.GRABBED:
            assert rows[user.pk] == answer.amount_cents  # written on its own after the cut
        else:
            assert answer.outcome is Outcome.CONTENDED and user.pk not in rows
    assert_consistent(activity)


def test_a_batch_cut_before_commit_is_not_answered_by_another_clicks_grab(
    mysql_proxy, make_users, sender, monkeypatch
):
    """`group_commit`: the batch [U, V] never reaches MySQL with its COMMIT (rolled back). Before
    it asks MySQL, U's other click (another process: its own connection and batch) grabs, and
    with equal amounts U's row reads as the batch would have written it. It is not the batch's:
    U and V hear "try again", and nobody is told `grabbed` for a row that is not there."""
    activity = send(sender, "group_commit", 10, "10.00", allocation_kind="equal")
    u, v = make_users(2)
    chosen = registry.get("group_commit")
    settle = type(chosen).settle_in_doubt

    def other_click() -> list[object]:
        try:
            return run_batch("group_commit", activity.pk, [u.pk])
        finally:
            connections.close_all()

    def other_click_first(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        with ThreadPoolExecutor(1) as pool:  # a thread of its own: a connection of its own
            other.extend(pool.submit(other_click).result())
        return settle(self, *args, **kwargs)

    other: list[object] = []
    monkeypatch.setattr(type(chosen), "settle_in_doubt", other_click_first)
    connection.ensure_connection()
    mysql_proxy.cut_before(b"COMMIT")
    answers = run_batch("group_commit", activity.pk, [u.pk, v.pk])
    assert mysql_proxy.fired == 1
    assert other == [GrabResult(Outcome.GRABBED, 100)]
    assert answers == [GrabResult(Outcome.CONTENDED)] * 2
    assert rows_of(activity) == {u.pk: 100}
    assert_consistent(activity)


def test_a_batch_that_wrote_nothing_stands_when_its_commit_reply_is_lost(
    mysql_proxy, make_users, sender
):
    """`group_commit`: a batch whose members all hold a grab writes nothing and sends a bare
    COMMIT; its reply lost, the answers read under the row lock stand."""
    activity = send(sender, "group_commit")
    (user,) = make_users(1)
    (first,) = run_batch("group_commit", activity.pk, [user.pk])
    assert isinstance(first, GrabResult) and first.outcome is Outcome.GRABBED
    connection.ensure_connection()
    mysql_proxy.drop_reply(b"\x03COMMIT")
    answers = run_batch("group_commit", activity.pk, [user.pk])
    assert mysql_proxy.fired == 1
    assert answers == [GrabResult(Outcome.ALREADY_GRABBED, first.amount_cents)]
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", ["group_commit", "redis_queue", "redis_counter"])
def test_a_batch_spanning_the_last_packet_whose_write_failed_says_no_sold_out(
    strategy, mysql_proxy, make_users, sender
):
    """Its `sold_out` answers counted on the batch's rows taking the last packets; those rows
    were not written (the packets went back), so the rest hear "try again", and a fast answer
    learned from them could not turn the packets away (redpack/finished.py)."""
    activity = send(sender, strategy, count=1, total="1.00")
    users = make_users(3)
    connection.ensure_connection()
    mysql_proxy.cut_before(b"COMMIT")
    answers = run_batch(strategy, activity.pk, [u.pk for u in users])
    assert mysql_proxy.fired == 1
    outcomes = [a.outcome for a in answers if isinstance(a, GrabResult)]
    assert len(outcomes) == 3 and Outcome.SOLD_OUT not in outcomes
    if Outcome.GRABBED not in outcomes:  # nothing written: the packet is still there
        retry = services.activity_grab(activity_id=activity.pk, user_id=users[2].pk)
        assert retry.outcome is Outcome.GRABBED
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", ["group_commit", "redis_queue", "redis_counter"])
def test_a_batch_that_cannot_learn_its_commit_answers_unknown_and_retries_converge(
    strategy, mysql_proxy, make_users, sender
):
    activity = send(sender, strategy)
    users = make_users(2)
    connection.ensure_connection()
    mysql_proxy.drop_reply(b"COMMIT", then_cut=True)
    answers = run_batch(strategy, activity.pk, [u.pk for u in users])
    assert all(isinstance(a, OutcomeUnknown) for a in answers)
    mysql_proxy.restore()
    connection.close()
    retries = [services.activity_grab(activity_id=activity.pk, user_id=u.pk) for u in users]
    # The batch committed: each retry finds its user's row.
    assert [r.outcome for r in retries] == [Outcome.ALREADY_GRABBED] * 2
    assert rows_of(activity) == {u.pk: r.amount_cents for u, r in zip(users, retries, strict=True)}
    assert_consistent(activity)


def test_a_redis_script_error_mid_batch_leaves_nothing_half_done(make_users, sender):
    """redis_counter checks and draws for every member before its first write: a corrupt state
    found at the second member fails the batch with nothing written, in Redis or MySQL."""
    activity = send(sender, "redis_counter", count=3, total="3.00")
    users = make_users(2)
    client = get_redis_connection("default")
    keys = Keys(activity.pk)
    client.hset(keys.meta, "remaining_cents", 2)  # below the 3 packets left: corrupt
    before = (client.get(keys.ordered()[1]), client.hgetall(keys.ordered()[2]))
    with pytest.raises(ResponseError, match="corrupt"):
        registry.get("redis_counter").decide_batch(  # type: ignore[attr-defined]
            activity.pk, [(u.pk, new_attempt(), "") for u in users]
        )
    assert (client.get(keys.ordered()[1]), client.hgetall(keys.ordered()[2])) == before
    assert rows_of(activity) == {}


@pytest.mark.parametrize("strategy", ["group_commit", "redis_queue", "redis_counter"])
def test_a_process_killed_mid_batch_leaves_no_grab_half_made(strategy, make_users, sender):
    """SIGKILL of the process leading a batch, between its decision and its commit: MySQL rolls
    the batch back (group_commit: the users grab afresh); the Redis strategies' marks have no
    rows (each user's retry waits for the row, then takes its mark over and writes it)."""
    activity = send(sender, strategy, count=3)
    users = make_users(2)
    leader = subprocess.Popen(
        [sys.executable, "-m", "tests.paused_grabber", strategy, str(activity.pk)]
        + [str(u.pk) for u in users],
        cwd=servers.ROOT,
        env=servers.service_env(),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert leader.stdout is not None
        assert leader.stdout.readline() == b"paused\n"  # decided, not committed
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait(timeout=30)
    assert rows_of(activity) == {}

    retries = [services.activity_grab(activity_id=activity.pk, user_id=u.pk) for u in users]
    expected = Outcome.GRABBED if strategy == "group_commit" else Outcome.ALREADY_GRABBED
    assert [r.outcome for r in retries] == [expected] * 2
    assert rows_of(activity) == {u.pk: r.amount_cents for u, r in zip(users, retries, strict=True)}
    assert_consistent(activity)


def test_a_batch_looks_its_members_up_under_the_row_lock(make_users, sender, monkeypatch):
    """group_commit reads which of its members already hold a grab in the statement that locks
    the activity row: a grab another process commits while the batch waits for that lock is
    seen, and its user hears `already_grabbed` with that amount, not a second packet; the
    batch's one INSERT is not refused (no member is run again alone)."""
    from strategies import group_commit

    activity = send(sender, "group_commit")
    first, second = make_users(2)
    inserts: list[object] = []
    write = GrabTransaction.commit_with_grabs

    def counted_write(self, **kwargs):  # type: ignore[no-untyped-def]
        inserts.append(kwargs["rows"])
        return write(self, **kwargs)

    def not_alone(*args):  # type: ignore[no-untyped-def]
        raise AssertionError("a member was run again alone: the lookup missed a grab")

    monkeypatch.setattr(GrabTransaction, "commit_with_grabs", counted_write)
    monkeypatch.setattr(group_commit.GroupCommitStrategy, "alone", not_alone)
    other = connections.create_connection("default")  # another process, as far as MySQL knows
    batch_connection: list[int] = []

    def batch_on_its_own_connection() -> list[object]:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT CONNECTION_ID()")
                batch_connection.append(cursor.fetchone()[0])
            return run_batch("group_commit", activity.pk, [first.pk, second.pk])
        finally:
            connection.close()

    try:
        with other.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            cursor.execute(
                "SELECT id FROM t_redpack_activity WHERE id = %s FOR UPDATE", [activity.pk]
            )
            cursor.execute(
                "INSERT INTO t_redpack_detail (activity_id, user_id, amount, created_at)"
                " VALUES (%s, %s, 1.25, NOW(6))",
                [activity.pk, first.pk],
            )
            cursor.execute(
                "UPDATE t_redpack_activity SET surplus_count = surplus_count - 1,"
                " surplus_amount = surplus_amount - 1.25 WHERE id = %s",
                [activity.pk],
            )
        with ThreadPoolExecutor(1) as pool:
            batch = pool.submit(batch_on_its_own_connection)
            try:
                servers.wait_for(
                    lambda: _waits_for_a_lock(other, batch_connection), "the batch at the row lock"
                )
            finally:
                other.commit()  # the batch goes on, whatever happened here
            answers = batch.result(timeout=30)
    finally:
        other.close()
    assert answers[0] == GrabResult(Outcome.ALREADY_GRABBED, 125)
    assert isinstance(answers[1], GrabResult) and answers[1].outcome is Outcome.GRABBED
    assert len(inserts) == 1  # one INSERT, of the second member's row alone
    assert rows_of(activity) == {first.pk: 125, second.pk: answers[1].amount_cents}
    assert_consistent(activity)


def test_a_lookup_the_server_cuts_short_is_made_again(make_users, sender, monkeypatch):
    """The members' grabs come back as one GROUP_CONCAT, which the server cuts at
    group_concat_max_len: a list cut short anywhere (a pair missing, an amount or a user id cut
    in the middle) is not read as it is, the members are looked up again under the same lock,
    and no member is refused by UNIQUE and run again alone."""
    from strategies import group_commit

    def not_alone(*args):  # type: ignore[no-untyped-def]
        raise AssertionError("a member was run again alone: the lookup missed a grab")

    limits = range(4, 25)  # every cut of two pairs of a few characters each
    activity = send(sender, "group_commit", count=2 + len(limits), total=f"{2 + len(limits)}.00")
    first, second, *others = make_users(2 + len(limits))
    earlier = run_batch("group_commit", activity.pk, [first.pk, second.pk])
    assert [a.outcome for a in earlier] == [Outcome.GRABBED] * 2  # type: ignore[union-attr]
    held = [GrabResult(Outcome.ALREADY_GRABBED, a.amount_cents) for a in earlier]  # type: ignore[union-attr]
    monkeypatch.setattr(group_commit.GroupCommitStrategy, "alone", not_alone)
    granted = {first.pk: held[0].amount_cents, second.pk: held[1].amount_cents}
    try:
        for limit, other in zip(limits, others, strict=True):
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION group_concat_max_len = %s", [limit])
            answers = run_batch("group_commit", activity.pk, [first.pk, second.pk, other.pk])
            assert answers[:2] == held, limit
            assert isinstance(answers[2], GrabResult) and answers[2].outcome is Outcome.GRABBED
            granted[other.pk] = answers[2].amount_cents
    finally:
        connection.close()  # the session's setting goes with it
    assert rows_of(activity) == granted
    assert_consistent(activity)


def _waits_for_a_lock(other, batch_connection: list[int]) -> bool:  # type: ignore[no-untyped-def]
    """Whether the batch's own connection is in a transaction waiting for a lock."""
    if not batch_connection:
        return False
    with other.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.innodb_trx"
            " WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id = %s",
            batch_connection,
        )
        return int(cursor.fetchone()[0]) == 1


def test_a_user_mysql_knows_whose_popped_packet_is_taken_hears_already_grabbed(make_users, sender):
    """Redis lost what MySQL holds: the user already has a grab in MySQL, and the packet Redis
    pops for them is taken in MySQL too. The claim comes first, finds the packet taken, and the
    answer is the grab MySQL holds; the packet is not put back."""
    from redpack.models import Packet, PacketStatus
    from strategies.redis_state.keys import parse_mark
    from strategies.steps import GrabRow, record_grabs

    activity = send(sender, "redis_queue")
    user, other = make_users(2)
    redis = get_redis_connection("default")
    packets_key = Keys(activity.pk).ordered()[3]
    queued = [parse_mark(m.decode()) for m in redis.lrange(packets_key, 0, -1)]
    (first_cents, first_packet), (held_cents, held_packet) = queued[0], queued[-1]
    with transaction.atomic():  # MySQL only: the user's grab, and the next packet taken
        assert record_grabs(
            activity_id=activity.pk,
            rows=[
                GrabRow(user.pk, held_cents, held_packet),
                GrabRow(other.pk, first_cents, first_packet),
            ],
        )
    (answer,) = run_batch("redis_queue", activity.pk, [user.pk])
    assert answer == GrabResult(Outcome.ALREADY_GRABBED, held_cents)
    assert Packet.objects.get(pk=first_packet).status == PacketStatus.TAKEN
    assert parse_mark(redis.lrange(packets_key, 0, 0)[0].decode()) != (first_cents, first_packet)
    assert rows_of(activity) == {user.pk: held_cents, other.pk: first_cents}
