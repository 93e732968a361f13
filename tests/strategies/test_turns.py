"""A turn per activity and process (strategies/turns.py): the seeds' one-grab transactions of one
activity reach MySQL one at a time from a process, other activities never wait for it, and a
wait that gives up is answered like InnoDB's lock wait timeout (`contended`, nothing written)."""

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

import pytest
from django.db import OperationalError

from redpack import dberrors, services, shards
from redpack.models import Activity, GrabDetail
from strategies import registry, turns
from strategies.base import Outcome
from strategies.steps import grab_transaction

WAIT = 10.0  # a bound on joins only; every wait below ends on an event, not a timer


def wait_for_waiters(count: int) -> None:
    """Until `count` threads hold or wait for a turn (they register before they block)."""
    never = threading.Event()
    for _ in range(int(WAIT / 0.001)):
        if turns.waiting() >= count:
            return
        never.wait(0.001)
    pytest.fail(f"{turns.waiting()} threads hold or wait for a turn, not {count}")


def send(sender, strategy: str, count: int) -> Activity:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal(count),
        total_count=count,
        strategy=strategy,
        expires_in=3600,
    )


@contextmanager
def held_elsewhere(key: int) -> Iterator[None]:
    """`key`'s turn held by another thread for the block."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with turns.turn(key):
            inside.set()
            release.wait(WAIT)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(WAIT)
    try:
        yield
    finally:
        release.set()
        holder.join(WAIT)


def test_one_holder_per_key_and_other_keys_pass():
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def first() -> None:
        with turns.turn(1):
            order.append("first in")
            inside.set()
            release.wait(WAIT)
            order.append("first out")

    def second() -> None:
        with turns.turn(1):
            order.append("second in")

    def other_key() -> None:
        with turns.turn(2):
            order.append("other key")

    holder = threading.Thread(target=first)
    holder.start()
    assert inside.wait(WAIT)
    waiter = threading.Thread(target=second)
    waiter.start()
    wait_for_waiters(2)
    passer = threading.Thread(target=other_key)
    passer.start()
    passer.join(WAIT)
    assert not passer.is_alive()  # key 2 never waited for key 1's holder
    assert order == ["first in", "other key"]
    release.set()
    holder.join(WAIT)
    waiter.join(WAIT)
    assert order == ["first in", "other key", "first out", "second in"]
    assert turns.waiting() == 0  # the entries are gone with their last user


def test_a_turn_is_reentrant_in_its_thread():
    with turns.turn(7), turns.turn(7):
        assert turns.waiting() == 2
    assert turns.waiting() == 0


def test_a_wait_that_gives_up_raises_the_lock_wait_timeout(monkeypatch):
    monkeypatch.setattr(turns, "WAIT_SECONDS", 0.0)
    caught: list[BaseException] = []
    with held_elsewhere(3):
        try:
            with turns.turn(3):
                pytest.fail("entered a turn another thread holds")
        except OperationalError as exc:
            caught.append(exc)
    assert caught and caught[0].args[0] == dberrors.LOCK_WAIT_TIMEOUT
    assert services.is_lock_timeout(caught[0])
    assert turns.waiting() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "strategy", ["pessimistic", "preallocated", "preallocated_skip_locked", "redis_queue_single"]
)
def test_a_grab_that_gets_no_turn_is_contended_and_writes_nothing(
    strategy, make_users, sender, monkeypatch
):
    [user] = make_users(1)
    activity = send(sender, strategy, 3)
    monkeypatch.setattr(turns, "WAIT_SECONDS", 0.0)
    with held_elsewhere(activity.pk):
        answer = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    assert answer.outcome is Outcome.CONTENDED
    assert not GrabDetail.objects.filter(activity_id=activity.pk).exists()
    again = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    assert again.outcome is Outcome.GRABBED


@pytest.mark.django_db(transaction=True)
def test_concurrent_grabs_of_one_activity_hold_its_turn_one_at_a_time(
    make_users, sender, monkeypatch
):
    """Eight threads grab at once: each transaction runs inside the turn, and no two at once."""
    users = make_users(8)
    activity = send(sender, "pessimistic", 5)
    lock = threading.Lock()
    inside = {"now": 0, "most": 0}
    original = turns.turn.__enter__

    def counting_enter(self: turns.turn) -> None:
        original(self)
        with lock:
            inside["now"] += 1
            inside["most"] = max(inside["most"], inside["now"])

    original_exit = turns.turn.__exit__

    def counting_exit(self: turns.turn, *exc: object) -> None:
        with lock:
            inside["now"] -= 1
        original_exit(self, *exc)  # type: ignore[arg-type]

    start = threading.Barrier(len(users))
    answers: list[Outcome] = []

    def grab(user_id: int) -> None:
        from django.db import connection

        start.wait(WAIT)
        try:
            answers.append(services.activity_grab(activity_id=activity.pk, user_id=user_id).outcome)
        finally:
            connection.close()

    monkeypatch.setattr(turns.turn, "__enter__", counting_enter)
    monkeypatch.setattr(turns.turn, "__exit__", counting_exit)
    threads = [threading.Thread(target=grab, args=(u.pk,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 3)
    assert sorted(a.value for a in answers) == ["grabbed"] * 5 + ["sold_out"] * 3
    assert inside["most"] == 1
    assert GrabDetail.objects.filter(activity_id=activity.pk).count() == 5


@pytest.mark.django_db(transaction=True)
def test_no_turn_inside_an_outer_transaction():
    """The outer transaction may already hold the row: a turn there could only add a wait."""
    with shards.atomic(), grab_transaction(turn=11):
        assert turns.waiting() == 0
    with grab_transaction(turn=11):
        assert turns.waiting() == 1
    assert turns.waiting() == 0


# distributed_lock reads the activity before its turn: the double click hears `already_grabbed`
# there, and only the late grab waits.
@pytest.mark.parametrize(("strategy", "queued"), [("pessimistic", 2), ("distributed_lock", 1)])
@pytest.mark.django_db(transaction=True)
def test_a_grab_that_waited_while_the_activity_ended_is_answered_from_memory(
    strategy, queued, sender, make_users, monkeypatch, settings
):
    """Grabs queued for the turn while another process took the last packet: once this process
    knows the end (redpack/finished.py), each is answered as a grab arriving then would be,
    `sold_out`, or `already_grabbed` with its amount for a user who holds a packet (a double
    click), without the lock and the transaction that would only tell it so."""
    from django.db import connections

    from redpack import finished

    settings.REDPACK_LOCK_WAIT = 60.0  # distributed_lock's turn: the waiters never give up here
    now = finished.clock()
    monkeypatch.setattr(finished, "clock", lambda: now)  # the memory learned below never ages
    activity = send(sender, strategy, 2)
    holder, late, elsewhere = make_users(3)
    first = services.activity_grab(activity_id=activity.pk, user_id=holder.pk)
    assert first.outcome is Outcome.GRABBED
    answers: dict[str, object] = {}

    def grab(name: str, user_id: int) -> None:
        try:
            answers[name] = services.activity_grab(activity_id=activity.pk, user_id=user_id)
        finally:
            shards.connection.close()

    with held_elsewhere(activity.pk):
        waiters = [
            threading.Thread(target=grab, args=("late", late.pk)),
            threading.Thread(target=grab, args=("again", holder.pk)),
        ]
        for waiter in waiters:
            waiter.start()
        if queued == 1:
            waiters[1].join(WAIT)  # answered by its read before the turn: not a waiter
        wait_for_waiters(1 + queued)  # the holder, and the grabs queued for the turn
        other = connections.create_connection("default")  # another process takes the last one
        try:
            with other.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO t_redpack_detail (activity_id, user_id, amount, created_at)"
                    " SELECT id, %s, surplus_amount, NOW(6) FROM t_redpack_activity WHERE id = %s",
                    [elsewhere.pk, activity.pk],
                )
                cursor.execute(
                    "UPDATE t_redpack_activity SET surplus_count = 0, surplus_amount = 0,"
                    " version = version + 1 WHERE id = %s",
                    [activity.pk],
                )
        finally:
            other.close()
        # ... and this process heard `sold_out` from a grab of its own meanwhile.
        finished.learn(activity.pk, services.GrabResult(Outcome.SOLD_OUT))
        # From here on, the strategy must not reach a store for these grabs.
        module = sys.modules[type(registry.get(strategy)).__module__]
        for store_call in ("read_for_grab", "activity_lock"):
            if hasattr(module, store_call):
                monkeypatch.setattr(module, store_call, _went_on)
    for waiter in waiters:
        waiter.join(WAIT)
    assert answers["late"] == services.GrabResult(Outcome.SOLD_OUT)
    assert answers["again"] == services.GrabResult(Outcome.ALREADY_GRABBED, first.amount_cents)
    assert GrabDetail.objects.filter(activity=activity).count() == 2
    assert turns.waiting() == 0


def _went_on(*args: object, **kwargs: object) -> None:
    raise AssertionError("a grab that waited went on to its store")
