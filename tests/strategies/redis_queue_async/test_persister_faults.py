"""redis_queue_async's persister as it runs: `celery -A redpack worker -B`, killed with SIGKILL in
the middle of a batch, and cut off from MySQL. Real processes, real MariaDB and Redis."""

import subprocess
import time
from contextlib import AbstractContextManager
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_redis import get_redis_connection

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail, PersistFailure
from redpack.money import to_cents
from strategies.base import Outcome
from strategies.redis_queue_async import stream
from strategies.redis_state.keys import Keys
from tests import servers
from tests.faults import FaultProxy
from tests.servers import kill_hard, uncommitted_rows, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# A worker that persists within a fraction of a second and takes over a dead consumer's
# entries after one second.
QUICK = {
    "REDPACK_PERSIST_INTERVAL": "0.2",
    "REDPACK_PERSIST_RECLAIM_INTERVAL": "0.5",
    "REDPACK_PERSIST_RECLAIM_SECONDS": "1",
}


def celery_worker(
    schedule: Path, *, pause: str | None = None, **env: str
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """The test worker, with the persister's intervals shortened."""
    return servers.celery_worker(schedule, pause=pause, **{**QUICK, **env})


def send(sender, count: int) -> Activity:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal(count),
        total_count=count,
        strategy="redis_queue_async",
        expires_in=3600,
    )


def grab_all(activity: Activity, users) -> dict[int, int]:  # type: ignore[no-untyped-def]
    answers = {}
    for user in users:
        result = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
        assert result.outcome is Outcome.GRABBED
        assert result.amount_cents is not None
        answers[user.pk] = result.amount_cents
    return answers


def rows(activity: Activity) -> dict[int, int]:
    return {
        user_id: to_cents(amount)
        for user_id, amount in GrabDetail.objects.filter(activity=activity).values_list(
            "user_id", "amount"
        )
    }


def stream_key(activity: Activity) -> str:
    return Keys(activity.pk).persist


def delivered_unacknowledged(activity: Activity) -> int:
    redis = get_redis_connection("default")
    if not redis.exists(stream_key(activity)):
        return 0
    try:
        return int(redis.xpending(stream_key(activity), stream.GROUP)["pending"])
    except Exception:  # noqa: BLE001 - no group yet: nothing delivered
        return 0


def assert_exactly_once(activity: Activity, answers: dict[int, int]) -> None:
    """Every acknowledged grab is one row with its amount; nothing else; surplus agrees."""
    assert get_redis_connection("default").xlen(stream_key(activity)) == 0
    assert rows(activity) == answers
    assert GrabDetail.objects.filter(activity=activity).count() == len(answers)
    activity.refresh_from_db()
    assert activity.surplus_count == activity.total_count - len(answers)
    report = audit_activity(activity, answers=list(answers.items()))
    assert report.ok, report.violations
    assert not PersistFailure.objects.exists()


def test_celery_worker_and_beat_persist_grabs_without_anyone_settling(make_users, sender, tmp_path):
    activity = send(sender, 30)
    users = make_users(30)
    with celery_worker(tmp_path / "beat"):
        answers = grab_all(activity, users)
        wait_for(lambda: len(rows(activity)) == 30, "the worker to persist 30 grabs")
        wait_for(lambda: stream.lag()["pending"] == 0, "the stream to empty")
    assert_exactly_once(activity, answers)


@pytest.mark.parametrize(
    ("pause", "committed"),
    [("before_commit", False), ("before_ack", True)],
    ids=["killed-before-commit", "killed-after-commit-before-ack"],
)
def test_sigkill_mid_batch_then_restart_writes_every_grab_once(
    pause, committed, make_users, sender, tmp_path
):
    """The persister dies holding a batch: before its commit (MySQL rolls back) or after it
    (MySQL has the rows, the stream does not know). The next worker takes the batch over."""
    activity = send(sender, 50)
    users = make_users(50)
    answers = grab_all(activity, users[:40])
    with celery_worker(tmp_path / "beat-1", pause=f"{pause}:300") as doomed:
        wait_for(lambda: delivered_unacknowledged(activity) == 40, "the batch to be delivered")
        if committed:
            wait_for(lambda: len(rows(activity)) == 40, "the batch to commit")
        else:  # 40 details, 40 packets and the activity row written, not committed
            wait_for(lambda: uncommitted_rows() >= 81, "the batch's statements to run")
        kill_hard(doomed)
    assert len(rows(activity)) == (40 if committed else 0)
    assert delivered_unacknowledged(activity) == 40  # pending, for a consumer that is gone
    answers |= grab_all(activity, users[40:])  # grabs go on meanwhile

    with celery_worker(tmp_path / "beat-2"):
        wait_for(
            lambda: len(rows(activity)) == 50 and stream.lag()["pending"] == 0,
            "the new worker to take the batch over and persist everything",
        )
    assert_exactly_once(activity, answers)


def test_mysql_unavailable_grabs_are_answered_then_drain_when_it_returns(
    make_users, sender, tmp_path
):
    db = settings.DATABASES["default"]
    proxy = FaultProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 3306)))
    through_proxy = f"mysql://{db['USER']}:{db['PASSWORD']}@127.0.0.1:{proxy.port}/{db['NAME']}"
    activity = send(sender, 40)
    users = make_users(40)
    # Grabs the worker read while MySQL was away are handed back for the next reclaim run: no
    # waiting out REDPACK_PERSIST_RECLAIM_SECONDS, here far longer than the test.
    never = {"REDPACK_PERSIST_RECLAIM_SECONDS": "600"}
    with celery_worker(tmp_path / "beat", DATABASE_URL=through_proxy, **never) as worker:
        answers = grab_all(activity, users[:10])
        # In MySQL and out of the stream: a batch whose COMMIT the cut below could still catch
        # in flight (committed, its reply lost) would stay pending beside the next twenty.
        wait_for(
            lambda: len(rows(activity)) == 10 and stream.lag()["pending"] == 0,
            "the worker to persist through the proxy",
        )

        proxy.cut()
        with CaptureQueriesContext(connection) as queries:
            answers |= grab_all(activity, users[10:30])  # answered with MySQL out of reach
        assert len(queries) == 0
        time.sleep(3)  # several persist and reclaim runs fail meanwhile (the age below)
        # Read by the worker (its persist runs at its own pace, niced), not persisted.
        wait_for(
            lambda: delivered_unacknowledged(activity) == 20,
            "the worker to read the twenty grabs while MySQL is away",
        )
        assert len(rows(activity)) == 10
        lag = stream.lag()
        assert lag["pending"] == 20 and lag["oldest_age_seconds"] >= 3
        assert not PersistFailure.objects.exists()  # an outage is not the grabs' fault
        assert worker.poll() is None

        proxy.restore()
        answers |= grab_all(activity, users[30:])
        wait_for(
            lambda: len(rows(activity)) == 40 and stream.lag()["pending"] == 0,
            "the backlog to drain once MySQL is back",
            timeout=60,
        )
    proxy.cut()
    assert_exactly_once(activity, answers)
