"""`redis_rebuild` while grabs go on: the Redis strategies that write MySQL before answering
fence the activity, wait for the grabs that won before the fence, then rebuild; nothing is
resurrected or forgotten. Real MariaDB and Redis; the pause is in the grab's own code."""

import threading
import time
from decimal import Decimal

import pytest
from django.db import connection
from django_redis import get_redis_connection

from redpack import services
from redpack.audit import audit_activity
from redpack.models import GrabDetail
from redpack.money import to_cents
from strategies import registry
from strategies.base import GrabResult, Outcome
from strategies.redis_state import RedisStateStrategy
from strategies.redis_state.keys import Keys

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(condition, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def in_thread(target, *args, **kwargs) -> tuple[threading.Thread, dict]:  # type: ignore[no-untyped-def]
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = target(*args, **kwargs)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


@pytest.mark.parametrize("strategy", ["redis_counter", "redis_queue"])
def test_a_rebuild_waits_for_the_grabs_that_won_before_it(
    strategy, monkeypatch, make_users, sender
):
    activity = services.activity_send(
        sender_id=sender.pk, total_amount=Decimal("5.00"), total_count=5, strategy=strategy
    )
    early, during = make_users(2)
    won, go = threading.Event(), threading.Event()
    write = RedisStateStrategy.write

    def write_once_let_go(self, *args, **kwargs) -> GrabResult:  # type: ignore[no-untyped-def]
        if not go.is_set():  # the first grab: Redis decided, MySQL not yet written
            won.set()
            assert go.wait(30)
        return write(self, *args, **kwargs)

    monkeypatch.setattr(RedisStateStrategy, "write", write_once_let_go)
    grabber, grabbed = in_thread(services.activity_grab, activity_id=activity.pk, user_id=early.pk)
    assert won.wait(30)

    rebuilder, _ = in_thread(registry.get(strategy).rebuild, activity_id=activity.pk)
    meta = Keys(activity.pk).meta
    redis = get_redis_connection("default")
    wait_for(lambda: redis.hexists(meta, "fenced_until_ms"), "the rebuild to fence the activity")
    # From another process (a strategy instance of its own): in this one, the grab would join
    # the batch after the stalled one.
    other_process = type(registry.get(strategy))()
    fenced = other_process.grab(activity_id=activity.pk, user_id=during.pk)
    assert fenced.outcome is Outcome.CONTENDED  # no grab while the state is being rebuilt
    go.set()
    grabber.join(60)
    rebuilder.join(60)

    first = grabbed["result"]
    assert first.outcome is Outcome.GRABBED
    rows = {d.user_id: to_cents(d.amount) for d in GrabDetail.objects.filter(activity=activity)}
    assert rows == {early.pk: first.amount_cents}
    assert not redis.hexists(meta, "fenced_until_ms")  # the rebuilt state is in service
    activity.refresh_from_db()
    assert audit_activity(activity).violations == []  # the winner is in the rebuilt state
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=during.pk).outcome
        is Outcome.GRABBED
    )
    activity.refresh_from_db()
    assert audit_activity(activity).violations == []
