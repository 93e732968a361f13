"""/metrics counts what happened: bursts of grabs over real HTTP, against real gunicorn servers
(2 workers each, so a server's document sums its processes), compared with the answers the
clients got and with the rows in MySQL, and two servers behind one balancer."""

import threading
from collections import Counter

import pytest
from rest_framework_simplejwt.tokens import AccessToken

from redpack.audit import audit_activity
from redpack.lab.stats import cause_of
from redpack.models import Activity, GrabDetail
from strategies import registry
from tests.faults import RoundRobinProxy
from tests.servers import call, grabs_by_outcome, gunicorn, scrape

USERS = 120
PACKETS = 40


def send(base: str, sender, strategy: str) -> int:  # type: ignore[no-untyped-def]
    status, created = call(
        "POST",
        f"{base}/api/activities/",
        str(AccessToken.for_user(sender)),
        {"total_amount": "40.00", "total_count": PACKETS, "strategy": strategy},
    )
    assert status == 201, created
    return int(created["id"])


def burst(bases: list[str], users: list, activity_id: int) -> Counter[str]:  # type: ignore[type-arg]
    """Every user clicks twice at once, each click at the next of `bases`; the answers by the
    cause the lab names them with (the outcome labels of redpack_grabs_total)."""
    tokens = [str(AccessToken.for_user(user)) for user in users]
    clicks = [token for token in tokens for _ in range(2)]
    causes: Counter[str] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(len(clicks))

    def click(index: int, token: str) -> None:
        barrier.wait(timeout=60)
        base = bases[index % len(bases)]
        status, body = call("POST", f"{base}/api/activities/{activity_id}/grab/", token)
        with lock:
            causes[cause_of(status, body, None)] += 1

    threads = [threading.Thread(target=click, args=pair) for pair in enumerate(clicks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert sum(causes.values()) == len(clicks)
    return causes


def gauge(base: str, name: str) -> float | None:
    values = [s.value for f in scrape(base) for s in f.samples if s.name == name]
    return values[0] if values else None


def settled_rows(strategy: str, activity_id: int) -> int:
    assert registry.get(strategy).settle(activity_id=activity_id, timeout=60)
    activity = Activity.objects.get(pk=activity_id)
    report = audit_activity(activity)
    assert report.ok, report.violations
    return GrabDetail.objects.filter(activity_id=activity_id).count()


def nonzero(counts: Counter[str]) -> Counter[str]:
    return Counter({key: value for key, value in counts.items() if value})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", ["group_commit", "redis_counter"])
def test_a_burst_is_counted_once_per_answer(strategy, make_users, sender):
    users = make_users(USERS)
    with gunicorn(workers=2, threads=32) as base:
        activity_id = send(base, sender, strategy)
        answered = burst([base], users, activity_id)
        counted = grabs_by_outcome(base, strategy)
        latency = [
            s.value
            for f in scrape(base)
            for s in f.samples
            if s.name == "redpack_grab_seconds_count" and s.labels["strategy"] == strategy
        ]
    assert nonzero(counted) == answered
    assert counted["grabbed"] == settled_rows(strategy, activity_id)
    assert latency == [sum(answered.values())]  # one observation per answer


@pytest.mark.django_db(transaction=True)
def test_write_behind_lag_is_read_at_scrape_time(make_users, sender):
    """redis_queue_async answers before MySQL has the grab; with no persister running, every
    grabbed answer waits in Redis: the scrape says how many, and none once settled."""
    strategy = "redis_queue_async"
    users = make_users(USERS)
    with gunicorn(workers=2, threads=32) as base:
        activity_id = send(base, sender, strategy)
        answered = burst([base], users, activity_id)
        assert gauge(base, "redpack_persist_pending") == answered["grabbed"] > 0
        assert (gauge(base, "redpack_persist_lag_seconds") or 0) >= 0
        assert nonzero(grabs_by_outcome(base, strategy)) == answered
        assert settled_rows(strategy, activity_id) == answered["grabbed"]
        assert gauge(base, "redpack_persist_pending") == 0


@pytest.mark.django_db(transaction=True)
def test_two_servers_behind_a_balancer_sum_to_the_rows(make_users, sender):
    """Two web servers on their own ports behind one round-robin proxy, grabbing the same
    activity (batches form in each server's processes, the row or the hash slot is shared):
    the audit is clean and their two /metrics add up to the MySQL rows, outcome by outcome."""
    strategy = "redis_queue"
    users = make_users(USERS)
    with gunicorn(workers=2, threads=32) as first, gunicorn(workers=2, threads=32) as second:
        ports = [int(base.rsplit(":", 1)[1]) for base in (first, second)]
        proxy = RoundRobinProxy([("127.0.0.1", port) for port in ports])
        balanced = f"http://127.0.0.1:{proxy.port}"
        try:
            activity_id = send(balanced, sender, strategy)
            answered = burst([balanced], users, activity_id)
            each = [grabs_by_outcome(base, strategy) for base in (first, second)]
        finally:
            proxy.cut()
    assert proxy.connections >= len(users) * 2
    assert all(sum(counts.values()) for counts in each), each  # both servers answered grabs
    assert nonzero(each[0] + each[1]) == answered
    assert each[0]["grabbed"] + each[1]["grabbed"] == settled_rows(strategy, activity_id)
