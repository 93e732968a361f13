"""The books (redpack/ledger.py) on the real MariaDB and Redis: a send, a refund and each grab's
credit move money exactly once, concurrent sends never overdraw, a crediting worker killed
mid-transaction leaves nothing half-done; the auditor is the oracle."""

import threading
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redpack import ledger, selectors, services
from redpack.audit import audit_activity, audit_books
from redpack.errors import InsufficientBalance
from redpack.models import Account, Activity, GrabDetail, JournalEntry, JournalLine
from redpack.money import from_cents, to_cents
from strategies.base import Outcome
from tests import servers
from tests.servers import kill_hard, uncommitted_rows, wait_for

pytestmark = pytest.mark.django_db


def send(sender, total: str = "10.00", count: int = 5, strategy: str = "pessimistic") -> Activity:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk, total_amount=Decimal(total), total_count=count, strategy=strategy
    )


def grab_each(activity: Activity, users) -> dict[int, int]:  # type: ignore[no-untyped-def]
    """Each user grabs once; the cents each was told."""
    told = {}
    for user in users:
        result = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
        if result.outcome is Outcome.GRABBED:
            assert result.amount_cents is not None
            told[user.pk] = result.amount_cents
    return told


def credit_all() -> int:
    return ledger.grabs_credit(batch=500, run_seconds=600)


def cents(user) -> int:  # type: ignore[no-untyped-def]
    return to_cents(selectors.wallet_balance(user_id=user.pk))


def escrow_cents(activity: Activity) -> int:
    return to_cents(Account.objects.get(activity=activity).balance)


def assert_books(*, drained: bool = True) -> None:
    report = audit_books(drained=drained)
    assert report.ok, report.violations


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run each call in its own thread and connection, released together by one barrier;
    returns each one's result or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            connection.ensure_connection()
            barrier.wait(timeout=60)
            results[index] = calls[index]()
        except Exception as exc:  # noqa: BLE001 - returned to the test, which asserts on it
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_money_goes_sender_to_escrow_to_grabbers_and_back(make_users):
    (sender,) = make_users(1, prefix="sender", balance="100.00")
    grabbers = make_users(3, balance="0")
    activity = send(sender, "10.00", 5)
    assert cents(sender) == 9000 and escrow_cents(activity) == 1000
    told = grab_each(activity, grabbers)
    assert all(cents(user) == 0 for user in grabbers)  # nothing on the grab path
    assert credit_all() == 3
    assert {user.pk: cents(user) for user in grabbers} == told
    services.activity_expire(activity_id=activity.pk, force=True)
    left = 1000 - sum(told.values())
    assert cents(sender) == 9000 + left
    assert escrow_cents(activity) == 0
    activity.refresh_from_db()
    assert audit_activity(activity).ok
    assert_books()


def test_insufficient_balance_writes_nothing(make_users):
    (poor,) = make_users(1, prefix="poor", balance="5.00")
    (broke,) = make_users(1, prefix="broke", balance="0")
    entries = JournalEntry.objects.count()
    for user in (poor, broke):
        with pytest.raises(InsufficientBalance) as refused:
            send(user, "10.00", 5)
        assert refused.value.field == "total_amount"
        assert refused.value.code == "insufficient_balance" and refused.value.status == 400
    assert not Activity.objects.exists()
    assert JournalEntry.objects.count() == entries
    assert cents(poor) == 500 and cents(broke) == 0
    assert_books()


def test_crediting_twice_credits_each_grab_once(sender, make_users):
    activity = send(sender, "10.00", 5)
    grabbers = make_users(4, balance="0")
    told = grab_each(activity, grabbers)
    assert credit_all() == 4
    assert credit_all() == 0
    assert JournalEntry.objects.filter(kind="credit").count() == 4
    assert {user.pk: cents(user) for user in grabbers} == told
    assert ledger.crediting_lag() == {"pending": 0, "oldest_age_seconds": 0.0}
    assert_books()


def test_a_crediting_run_larger_than_one_insert_writes_every_row(sender, make_users, monkeypatch):
    """The journal's rows go out in INSERTs of at most ledger.INSERT_ROWS: with 3, five grabs'
    five entries and ten lines take two and four statements, and every one is written once."""
    monkeypatch.setattr(ledger, "INSERT_ROWS", 3)
    activity = send(sender, "10.00", 5)
    grabbers = make_users(5, balance="0")
    told = grab_each(activity, grabbers)
    assert len(told) == 5
    assert credit_all() == 5
    assert JournalEntry.objects.filter(kind="credit").count() == 5
    assert JournalLine.objects.filter(entry__kind="credit").count() == 10
    assert {user.pk: cents(user) for user in grabbers} == told
    assert escrow_cents(activity) == 0
    assert_books()


def test_lag_counts_the_uncredited_grabs(sender, make_users):
    activity = send(sender, "10.00", 5)
    grab_each(activity, make_users(2, balance="0"))
    assert ledger.crediting_lag()["pending"] == 2
    assert audit_books(drained=False).ok
    assert not audit_books(drained=True).ok  # "every grab credited" fails until crediting runs


def test_oversold_rows_are_credited_only_as_far_as_the_escrow_goes(sender, make_users):
    """An overselling strategy's extra row cannot be paid: it stays uncredited, the escrow never
    goes below what it owes, and the auditor reports the activity."""
    activity = send(sender, "2.00", 2)
    first, second, third = make_users(3, balance="0")
    grab_each(activity, [first, second])
    GrabDetail.objects.create(activity=activity, user=third, amount=Decimal("1.00"))
    assert credit_all() == 2
    assert cents(third) == 0 and escrow_cents(activity) == 0
    activity.refresh_from_db()
    assert not audit_activity(activity).ok
    assert audit_books(drained=False).ok


@pytest.mark.django_db(transaction=True)
def test_parallel_sends_by_one_sender_never_overdraw(make_users):
    (sender,) = make_users(1, prefix="sender", balance="10.00")
    results = at_once(*[lambda: send(sender, "3.00", 3) for _ in range(12)])
    sent = [r for r in results if isinstance(r, Activity)]
    refused = [r for r in results if isinstance(r, InsufficientBalance)]
    assert (len(sent), len(refused)) == (3, 9), results
    assert cents(sender) == 100
    assert Activity.objects.count() == 3
    assert_books()


@pytest.mark.django_db(transaction=True)
def test_two_crediting_runs_at_once_credit_each_grab_once(sender, make_users):
    activity = send(sender, "30.00", 30)
    grabbers = make_users(30, balance="0")
    told = grab_each(activity, grabbers)
    done = at_once(
        lambda: ledger.grabs_credit(batch=7, run_seconds=60),
        lambda: ledger.grabs_credit(batch=5, run_seconds=60),
    )
    assert all(isinstance(n, int) for n in done), done
    assert sum(done) == 30, done
    assert {user.pk: cents(user) for user in grabbers} == told
    assert_books()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", ["pessimistic", "redis_counter"])
def test_refund_racing_the_last_credit(strategy, make_users):
    """The refund and the crediting of the last grabs run at once: each pays once, in either
    order, and the escrow ends at exactly 0."""
    (sender,) = make_users(1, prefix="sender", balance="50.00")
    for _ in range(3):
        start = cents(sender)
        activity = send(sender, "10.00", 10, strategy)
        grabbers = make_users(4, balance="0")
        told = grab_each(activity, grabbers)
        refund, _ = at_once(
            lambda: services.activity_expire(activity_id=activity.pk, force=True),  # noqa: B023
            credit_all,
        )
        credit_all()
        assert refund.amount_cents == 1000 - sum(told.values())
        assert escrow_cents(activity) == 0
        assert cents(sender) == start - 1000 + refund.amount_cents
        assert {user.pk: cents(user) for user in grabbers} == told
        activity.refresh_from_db()
        assert audit_activity(activity).ok
    assert_books()


@pytest.mark.django_db(transaction=True)
def test_a_crediting_worker_killed_mid_transaction_credits_nothing_then_all_once(
    sender, make_users, tmp_path
):
    """A real worker (celery -A redpack worker -B) SIGKILLed with its crediting transaction
    written but not committed: MySQL rolls it back; the next worker credits every grab once."""
    activity = send(sender, "10.00", 10)
    grabbers = make_users(10, balance="0")
    told = grab_each(activity, grabbers)
    with servers.celery_worker(tmp_path / "beat-1", pause="credit_before_commit:300") as doomed:
        # 10 entries, 20 lines, 10 wallets and the escrow written, not committed
        wait_for(lambda: uncommitted_rows() >= 41, "the crediting transaction to be written")
        kill_hard(doomed)
    assert not JournalEntry.objects.filter(kind="credit").exists()
    assert all(cents(user) == 0 for user in grabbers)
    assert_books(drained=False)
    with servers.celery_worker(tmp_path / "beat-2"):
        wait_for(lambda: ledger.crediting_lag()["pending"] == 0, "the next worker to credit")
    assert {user.pk: cents(user) for user in grabbers} == told
    assert_books()


CRASH_POINTS = {
    # Each raises inside the crediting transaction, after that step's statements ran: the
    # function it replaces, whether the original runs first, and on which of its calls (the
    # lines are the second table a crediting run inserts into).
    "after its entries": ("_insert", False, lambda model, *_: model is JournalLine),
    "after its lines": ("_apply", False, None),
    "before its commit": ("_post_credits", True, None),
}


class Crash(Exception):
    pass


def crashing(point: str) -> Any:
    name, after, on = CRASH_POINTS[point]
    original = getattr(ledger, name)

    def crash(*args: Any, **kwargs: Any) -> Any:
        if on is not None and not on(*args, **kwargs):
            return original(*args, **kwargs)
        if after:
            original(*args, **kwargs)
        raise Crash(point)

    return mock.patch.object(ledger, name, crash)


def journal_state() -> tuple[int, int, dict[int, Decimal]]:
    """Entries, lines and every account's balance: what a crediting run may change."""
    balances = dict(Account.objects.values_list("pk", "balance"))
    return JournalEntry.objects.count(), JournalLine.objects.count(), balances


USERS = 4
START = 2000  # cents each user holds at the start of an example
operation = st.one_of(
    st.tuples(
        st.just("send"),
        st.integers(0, USERS - 1),
        st.integers(1, 1500),
        st.integers(1, 4),
        st.sampled_from(["pessimistic", "preallocated"]),  # redis_* install on commit
    ),
    st.tuples(st.just("grab"), st.integers(0, USERS - 1), st.integers(0, 5)),
    st.tuples(st.just("expire"), st.integers(0, 5)),
    st.tuples(st.just("credit"), st.integers(1, 3)),
    st.tuples(st.just("crash"), st.integers(1, 3), st.sampled_from(sorted(CRASH_POINTS))),
)


@settings(
    max_examples=15,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(operations=st.lists(operation, min_size=1, max_size=30))
def test_books_balance_whatever_happens(operations, make_users):
    """Random sends (some beyond the balance), grabs, expiries, crediting runs of any batch
    size and crediting runs that crash between steps: every balance is what the answers say,
    and the books balance."""
    users = make_users(USERS, balance=str(from_cents(START)))
    expected = {user.pk: START for user in users}
    sent: list[Activity] = []
    grabbed: dict[int, int] = defaultdict(int)  # cents told `grabbed`, by user
    for op in operations:
        if op[0] == "send":
            _, who, total, count, strategy = op
            if total < count:
                continue
            user = users[who]
            try:
                sent.append(send(user, str(from_cents(total)), count, strategy))
                expected[user.pk] -= total
            except InsufficientBalance:
                assert expected[user.pk] < total
        elif op[0] == "grab" and sent:
            activity = sent[op[2] % len(sent)]
            user = users[op[1]]
            result = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
            if result.outcome is Outcome.GRABBED:
                assert result.amount_cents is not None
                grabbed[user.pk] += result.amount_cents
        elif op[0] == "expire" and sent:
            activity = sent[op[1] % len(sent)]
            refund = services.activity_expire(activity_id=activity.pk, force=True)
            if refund.refunded_now:
                expected[activity.sender_id] += refund.amount_cents
        elif op[0] == "credit":
            ledger.grabs_credit(batch=op[1], run_seconds=60)
        elif op[0] == "crash" and ledger.crediting_lag()["pending"]:
            before = journal_state()
            with crashing(op[2]), pytest.raises(Crash):
                ledger.grabs_credit(batch=op[1], run_seconds=60)
            assert journal_state() == before  # nothing of it survived
    credit_all()
    assert {u.pk: cents(u) for u in users} == {u: expected[u] + grabbed[u] for u in expected}
    for activity in sent:
        activity.refresh_from_db()
        report = audit_activity(activity)
        assert report.ok and report.uncredited == 0, report.violations
    assert_books()
