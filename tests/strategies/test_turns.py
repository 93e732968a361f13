"""A turn per activity and process (strategies/turns.py): the seeds' one-grab transactions of one
activity reach MySQL one at a time from a process, other activities never wait for it, and a
wait that gives up is answered like InnoDB's lock wait timeout (`contended`, nothing written)."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

import pytest
from django.db import OperationalError

from redpack import services, shards
from redpack.models import Activity, GrabDetail
from strategies import turns
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
    assert caught and caught[0].args[0] == turns.LOCK_WAIT_TIMEOUT
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
