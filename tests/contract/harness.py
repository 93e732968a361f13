"""Drive any strategy with many concurrent grabbers, each clicking twice at once; the contract."""

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.contrib.auth.models import AbstractUser
from django.db import connection, connections

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail
from redpack.money import to_cents
from strategies import registry
from strategies.base import GrabResult, Outcome

CONNECT_AT_ONCE = 16
GRABBERS = 200
PACKETS = 50


@dataclass(frozen=True)
class Answer:
    user_id: int
    result: GrabResult


def grab_concurrently(
    activity_id: int, user_ids: Sequence[int], clicks_per_user: int = 2
) -> list[Answer]:
    """Start every click on one barrier, each in its own thread with its own DB connection."""
    clicks = [user_id for user_id in user_ids for _ in range(clicks_per_user)]
    barrier = threading.Barrier(len(clicks))
    # Connections are opened before the barrier, a few at a time: a burst of hundreds of
    # connects overflows the server's listen backlog, and the grabs are what is under test.
    connecting = threading.BoundedSemaphore(CONNECT_AT_ONCE)
    answers: list[Answer] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def click(user_id: int) -> None:
        try:
            with connecting:
                connection.ensure_connection()
            barrier.wait(timeout=120)
            result = services.activity_grab(activity_id=activity_id, user_id=user_id)
            with lock:
                answers.append(Answer(user_id, result))
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised by the caller
            with lock:
                errors.append(exc)
        finally:
            connections.close_all()  # default's, and a shard's when sharded (tests/test_shards.py)

    threads = [threading.Thread(target=click, args=(u,)) for u in clicks]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 300
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    assert len(answers) == len(clicks), "some grabbers never answered"
    return answers


def check_double_clicks(
    strategy_name: str, make_users: Callable[[int], list[AbstractUser]], sender: AbstractUser
) -> Activity:
    """200 grabbers, each clicking twice at once, over 50 packets: no oversell, no duplicate,
    and no holder told `sold_out`."""
    users = make_users(GRABBERS)
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("100.00"),
        total_count=PACKETS,
        strategy=strategy_name,
        expires_in=3600,
    )

    answers = grab_concurrently(activity.pk, [u.pk for u in users], clicks_per_user=2)
    assert registry.get(strategy_name).settle(activity_id=activity.pk, timeout=60)

    by_user = defaultdict(list)
    for answer in answers:
        by_user[answer.user_id].append(answer.result)
    grabbed = [
        (a.user_id, a.result.amount_cents) for a in answers if a.result.outcome is Outcome.GRABBED
    ]
    activity.refresh_from_db()
    report = audit_activity(activity, answers=grabbed)
    assert report.ok, report.violations
    assert report.oversold == 0 and report.duplicates == 0

    rows = {d.user_id: to_cents(d.amount) for d in GrabDetail.objects.filter(activity=activity)}
    assert len(grabbed) == len(rows) <= PACKETS
    for user_id, results in by_user.items():
        outcomes = [r.outcome for r in results]
        assert outcomes.count(Outcome.GRABBED) <= 1
        if user_id in rows:  # a holder's other click hears already_grabbed (or contended)
            assert Outcome.SOLD_OUT not in outcomes, (user_id, results)
        for result in results:
            if result.outcome is Outcome.ALREADY_GRABBED:
                assert result.amount_cents == rows[user_id]
            assert result.outcome in {
                Outcome.GRABBED,
                Outcome.ALREADY_GRABBED,
                Outcome.SOLD_OUT,
                Outcome.CONTENDED,
            }
    contended = sum(r.outcome is Outcome.CONTENDED for rs in by_user.values() for r in rs)
    if contended == 0:
        # Nobody was turned away, and there are four times more grabbers than packets.
        assert len(rows) == PACKETS
        assert Activity.objects.get(pk=activity.pk).surplus_count == 0
    assert sum(rows.values()) + to_cents(activity.surplus_amount) == 10_000
    return activity


def check_close_stops_grabs(
    strategy_name: str, make_users: Callable[[int], list[AbstractUser]], sender: AbstractUser
) -> Activity:
    """After close() every grab answers `closed`; closing twice changes nothing."""
    users = make_users(20)
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("10.00"),
        total_count=10,
        strategy=strategy_name,
        expires_in=3600,
    )
    strategy = registry.get(strategy_name)
    first = services.activity_grab(activity_id=activity.pk, user_id=users[0].pk)
    assert first.outcome is Outcome.GRABBED
    closed = strategy.close(activity_id=activity.pk)
    assert closed.remaining_count == 9
    assert closed.remaining_cents == 1000 - first.amount_cents

    answers = grab_concurrently(activity.pk, [u.pk for u in users[1:]], clicks_per_user=1)
    assert {a.result.outcome for a in answers} == {Outcome.CLOSED}
    assert strategy.close(activity_id=activity.pk) == closed  # closing twice changes nothing
    assert strategy.settle(activity_id=activity.pk, timeout=30)
    activity.refresh_from_db()
    assert audit_activity(activity).ok
    assert GrabDetail.objects.filter(activity=activity).count() == 1
    return activity
