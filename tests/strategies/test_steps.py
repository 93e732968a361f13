"""The shared steps' multi-row statements (strategies/steps.py), on real MariaDB: a batch's
packets are claimed all or none, and the values written inline are exactly the grabs'."""

from contextlib import nullcontext
from decimal import Decimal

import pytest
from django.db import (
    IntegrityError,
    OperationalError,
    close_old_connections,
    connection,
    connections,
    transaction,
)

from redpack import selectors, services
from redpack.models import Activity, GrabDetail, Packet, PacketStatus
from redpack.money import from_cents, sql_decimal, to_cents
from strategies import steps
from strategies.steps import GrabRow, claim_packets, insert_grab_rows

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("cents", "text"), [(0, "0.00"), (5, "0.05"), (100, "1.00"), (123456, "1234.56"), (-7, "-0.07")]
)
def test_cents_are_written_as_exact_decimal_literals(cents, text):
    assert sql_decimal(cents) == text
    assert to_cents(Decimal(text)) == cents


@pytest.mark.parametrize("cents", [1.5, "12", Decimal("1.00")])
def test_only_whole_cents_become_literals(cents):
    with pytest.raises(TypeError):
        sql_decimal(cents)


def packets_of(sender, count):  # type: ignore[no-untyped-def]
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("10.00"),
        total_count=count,
        strategy="redis_queue",
        allocation_kind="equal",
    )
    return activity, list(Packet.objects.filter(activity=activity).order_by("pk"))


def test_a_batch_claims_each_packet_for_its_own_user(make_users, sender):
    activity, packets = packets_of(sender, 4)
    users = make_users(3)
    rows = [GrabRow(u.pk, to_cents(p.amount), p.pk) for u, p in zip(users, packets, strict=False)]
    with transaction.atomic():
        assert claim_packets(activity_id=activity.pk, rows=rows)
        insert_grab_rows(activity_id=activity.pk, rows=rows)
    owners = dict(Packet.objects.filter(activity=activity).values_list("pk", "grabbed_by_id"))
    assert owners == {**{r.packet_id: r.user_id for r in rows}, packets[3].pk: None}
    assert sorted(
        GrabDetail.objects.filter(activity=activity).values_list("user_id", "amount", "redpack_id")
    ) == sorted((r.user_id, Decimal(sql_decimal(r.cents)), r.packet_id) for r in rows)


BAD_CLAIMS = ["wrong amount", "taken", "named twice", "another activity's"]


def a_bad_claim(make_users, sender, fault):  # type: ignore[no-untyped-def]
    """An activity of 3 packets, and a batch of 3 rows claiming them, one of them wrongly."""
    activity, packets = packets_of(sender, 3)
    users = make_users(3)
    rows = [GrabRow(u.pk, to_cents(p.amount), p.pk) for u, p in zip(users, packets, strict=True)]
    if fault == "wrong amount":
        rows[1] = GrabRow(rows[1].user_id, rows[1].cents + 1, rows[1].packet_id)
    elif fault == "taken":
        assert claim_packets(activity_id=activity.pk, rows=[rows[1]])
    elif fault == "named twice":
        rows[2] = GrabRow(rows[2].user_id, rows[2].cents, rows[1].packet_id)
    else:
        _, elsewhere = packets_of(sender, 3)
        rows[0] = GrabRow(rows[0].user_id, to_cents(elsewhere[0].amount), elsewhere[0].pk)
    return activity, rows


@pytest.mark.parametrize("fault", BAD_CLAIMS)
def test_a_batch_with_one_bad_claim_reports_it_and_rolls_back_whole(make_users, sender, fault):
    activity, rows = a_bad_claim(make_users, sender, fault)
    before = dict(Packet.objects.values_list("pk", "status"))

    class RolledBack(Exception):
        pass

    with pytest.raises(RolledBack), transaction.atomic():
        if not claim_packets(activity_id=activity.pk, rows=rows):
            raise RolledBack
    assert dict(Packet.objects.values_list("pk", "status")) == before
    if fault != "taken":
        assert set(before.values()) == {PacketStatus.AVAILABLE}


@pytest.mark.skipif(connection.vendor != "mysql", reason="the request path's raw queries")
@pytest.mark.parametrize("fault", BAD_CLAIMS)
@pytest.mark.parametrize("outer", [False, True])
def test_a_request_batch_whose_claim_falls_short_commits_nothing(make_users, sender, fault, outer):
    """On the request path the claim and the decrement go as one query
    (GrabTransaction.commit_with_grabs): when the claim falls short, the decrement does not
    run, so the activity's row is not taken (nor the surplus asked for more than it may hold,
    the wrong amount's case). Nothing of the transaction commits, even when the block ends
    without an error; the same inside an outer transaction (statement by statement, in Django's
    transaction)."""
    activity, rows = a_bad_claim(make_users, sender, fault)
    before = dict(Packet.objects.values_list("pk", "status"))
    surplus = Activity.objects.values_list("surplus_count", "surplus_amount", "version")
    left = surplus.get(pk=activity.pk)
    with transaction.atomic() if outer else nullcontext(), steps.grab_transaction() as grab:
        assert not grab.commit_with_grabs(activity_id=activity.pk, rows=rows)
        assert _activity_row_is_free(activity.pk)
        with pytest.raises(RuntimeError):  # and nothing more commits by it
            grab.commit_with_grabs(activity_id=activity.pk, rows=rows)
    assert dict(Packet.objects.values_list("pk", "status")) == before
    assert surplus.get(pk=activity.pk) == left
    assert not GrabDetail.objects.exists()


def _activity_row_is_free(activity_id: int) -> bool:
    """Whether another connection can lock the activity's row right now (NOWAIT: no waiting)."""
    import MySQLdb

    settings = connection.settings_dict
    other = MySQLdb.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=int(settings["PORT"] or 3306),
        user=settings["USER"],
        password=settings["PASSWORD"],
        database=settings["NAME"],
    )
    try:
        cursor = other.cursor()
        cursor.execute("START TRANSACTION")
        try:
            cursor.execute(
                "SELECT id FROM t_redpack_activity WHERE id = %s FOR UPDATE NOWAIT", [activity_id]
            )
        except MySQLdb.OperationalError:
            return False
        cursor.execute("ROLLBACK")
        return True
    finally:
        other.close()


@pytest.mark.skipif(connection.vendor != "mysql", reason="InnoDB's foreign key locks")
def test_a_batch_claims_its_packets_before_it_takes_the_activity_row(
    make_users, sender, monkeypatch
):
    """The lock order record_grabs relies on (steps.py): it claims the batch's packets first,
    and the claim leaves the activity row free, so two batches' claims never hold it shared;
    then the decrement takes the row (and the details' insert, whose foreign key would take it
    shared, comes after that)."""
    activity, packets = packets_of(sender, 2)
    users = make_users(2)
    rows = [GrabRow(u.pk, to_cents(p.amount), p.pk) for u, p in zip(users, packets, strict=True)]
    seen: list[tuple[bool, set[int]]] = []
    decrement = steps.take_from_surplus

    def look_then_decrement(**kwargs):  # type: ignore[no-untyped-def]
        claimed = Packet.objects.filter(activity=activity, status=PacketStatus.TAKEN)
        seen.append((_activity_row_is_free(activity.pk), set(claimed.values_list("pk", flat=True))))
        return decrement(**kwargs)

    monkeypatch.setattr(steps, "take_from_surplus", look_then_decrement)
    with transaction.atomic():
        assert steps.record_grabs(activity_id=activity.pk, rows=rows)
        assert not _activity_row_is_free(activity.pk)
    assert seen == [(True, {p.pk for p in packets})]


def on_a_connection_of_its_own(sql: str) -> None:
    spare = connections.create_connection("default")
    try:
        with spare.cursor() as cursor:
            cursor.execute(sql)
    finally:
        spare.close()


def pings_on_this_connection() -> int:
    """This connection's count of COM_PING and its kind (its session's Com_admin_commands), read
    by a statement, which is not one of them. Read it outside a request's first statement: that
    one may ping first."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Com_admin_commands'")
        return int(cursor.fetchone()[1])


def connection_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("strategy", ["pessimistic", "group_commit"])
def test_a_grab_transaction_pings_no_server_and_reopens_a_connection_that_died(
    make_users, sender, strategy, monkeypatch
):
    """Django pings MySQL before the first statement of each request (CONN_HEALTH_CHECKS); a
    grab's transaction goes without it. A connection killed since its last use is opened
    again and the grab written, as the ping would have had it."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)  # kept between requests
    connection.close()
    activity = services.activity_send(
        sender_id=sender.pk, total_amount=Decimal("10.00"), total_count=5, strategy=strategy
    )
    first, second = make_users(2)
    selectors.activity_strategy(activity.pk)  # read once per process and activity
    old = connection_id()
    before = pings_on_this_connection()
    close_old_connections()  # what request_started does: the next statement would ping first
    assert services.activity_grab(activity_id=activity.pk, user_id=first.pk).outcome.value == (
        "grabbed"
    )
    assert connection_id() == old
    assert pings_on_this_connection() == before

    on_a_connection_of_its_own(f"KILL CONNECTION {old}")
    close_old_connections()
    result = services.activity_grab(activity_id=activity.pk, user_id=second.pk)
    assert result.outcome.value == "grabbed"
    assert connection_id() != old
    written = GrabDetail.objects.filter(activity=activity).values_list("user_id", "amount")
    assert sorted(written) == sorted(
        [(first.pk, written.get(user_id=first.pk)[1]), (second.pk, from_cents(result.amount_cents))]
    )


@pytest.mark.parametrize("row_locked", [True, False])
def test_a_constraint_the_grab_write_breaks_is_an_integrity_error_and_nothing_commits(
    row_locked, make_users, sender
):
    """The INSERT of a grab row below one cent breaks a CHECK, which MySQL reports as an
    OperationalError: from the second statement of the query (read by nextset, row_locked) as
    from the first, the caller gets IntegrityError, as Django raises it from execute, and the
    decrement before it is rolled back."""
    activity, _ = packets_of(sender, 3)
    (user,) = make_users(1)
    with pytest.raises(IntegrityError), steps.grab_transaction() as transaction:
        if row_locked:
            steps.read_for_batch(activity_id=activity.pk, user_ids=[user.pk])
        transaction.commit_with_grabs(
            activity_id=activity.pk, rows=[GrabRow(user.pk, 0)], row_locked=row_locked
        )
    activity.refresh_from_db()
    assert (activity.surplus_count, activity.surplus_amount) == (3, Decimal("10.00"))
    assert not GrabDetail.objects.filter(activity=activity).exists()


def the_transactions_isolation_level() -> str:
    """This connection's open InnoDB transaction's isolation level."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT trx_isolation_level FROM information_schema.INNODB_TRX"
            " WHERE trx_mysql_thread_id = CONNECTION_ID()"
        )
        (level,) = cursor.fetchone()
    return str(level)


def test_a_grab_transaction_that_opens_its_connection_runs_at_the_connections_isolation_level(
    sender,
):
    """START TRANSACTION goes with the transaction's first statement; a new connection's own
    set-up statements (READ COMMITTED, redpack/settings.py) run before it, not inside the
    transaction, where MySQL would apply the level only from the next one."""
    activity, _ = packets_of(sender, 1)
    connection.close()
    with steps.grab_transaction():
        steps.read_for_grab(activity_id=activity.pk, user_id=None)
        assert the_transactions_isolation_level() == "READ COMMITTED"


def test_a_grab_transaction_whose_connection_closed_sends_nothing_more(make_users, sender):
    """The connection a grab transaction began on closed under it: MySQL rolled back what the
    transaction held, and its later statements are refused rather than run on a new
    connection, each committed on its own."""
    activity, _ = packets_of(sender, 2)
    (user,) = make_users(1)
    with pytest.raises(OperationalError), steps.grab_transaction():
        steps.take_from_surplus(activity_id=activity.pk, count=1, cents=500)
        connection.close()
        insert_grab_rows(activity_id=activity.pk, rows=[GrabRow(user.pk, 500)])
    activity.refresh_from_db()
    assert (activity.surplus_count, activity.surplus_amount) == (2, Decimal("10.00"))
    assert not GrabDetail.objects.filter(activity=activity).exists()
