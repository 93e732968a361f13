"""The lab's wrk runs (redpack/lab/wrk.py, wrk_grab.lua): every answer counted by cause, and a
real burst through gunicorn whose `grabbed` answers match MySQL's rows."""

import contextlib
import functools
import itertools
import socket
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal

import pytest
from rest_framework_simplejwt.tokens import AccessToken

from redpack import services
from redpack.lab import wrk
from redpack.lab.stats import HISTOGRAM_LABELS
from redpack.models import GrabDetail
from redpack.money import to_cents
from tests.servers import gunicorn

USERS = 60
PACKETS = 20


def test_every_answer_and_every_missing_one_has_a_cause():
    result = {
        "requests": 7,
        "duration_us": 2_000_000,
        "errors": {"connect": 0, "read": 1, "write": 0, "status": 2, "timeout": 1},
        "answers": {
            "200|grabbed||": 2,
            "200|sold_out||": 1,
            "409|contended|shed|": 1,
            "503|||outcome_unknown": 1,
            "500|||": 1,
        },
        "granted": ["0.50", "1.50"],
        "percentiles_us": {"50": 2000, "95": 900_000, "99": 1_500_000},
        "max_us": 1_600_000,
        "at_most_ms": {"10": 3, "50": 3, "1000": 5, "2000": 6},
    }

    summary = wrk.summarize(result, sent=9, seconds=2.0, cpu_seconds=1.0, connections=9)

    assert summary["causes"] == {
        "grabbed": 2,
        "sold_out": 1,
        "shed": 1,
        "outcome_unknown": 1,
        "5xx": 1,
        "client_timeout": 1,
        "connection_error": 2,  # 9 sent, 6 answered, 1 timed out
    }
    assert sum(summary["causes"].values()) == summary["requests"] == 9
    assert summary["unanswered"] == 3 and summary["answered"] == 6
    assert summary["outcomes"] == {"contended": 1, "grabbed": 2, "sold_out": 1}
    assert summary["p50_ms"] == 2.0 and summary["p99_ms"] == 1500.0 and summary["max_ms"] == 1600
    assert summary["within_1s"] == round(5 / 9, 4)
    labels = dict(zip(("≤10 ms", "≤1000 ms", "≤2000 ms"), (3, 2, 1), strict=True))
    assert summary["latency_histogram"] == labels
    assert set(summary["latency_histogram"]) <= set(HISTOGRAM_LABELS)
    assert summary["generator_cpu_share"] == 0.25 and not summary["generator_bound"]


def test_a_timed_runs_requests_without_an_answer_are_cut_off_or_lost():
    """In a timed run the script counts the requests it made: those without an answer were in
    flight when the clock stopped (at most one per connection: `cut_off`, on top of the
    requests) or lost with a connection that broke (`connection_error`, unanswered)."""
    result = {
        "requests": 6,
        "made": 10,
        "duration_us": 1_000_000,
        "errors": {"connect": 0, "read": 40, "write": 3, "status": 0, "timeout": 0},
        "answers": {"200|grabbed||": 6},
        "granted": ["0.50"] * 6,
        "percentiles_us": {"50": 2000, "95": 2000, "99": 2000},
        "max_us": 2000,
        "at_most_ms": {"10": 6},
    }

    timed = wrk.summarize(result, sent=None, seconds=1.0, cpu_seconds=0.1, connections=3)

    assert timed["causes"] == {"grabbed": 6, "connection_error": 1, "cut_off": 3}
    assert timed["requests"] == 7 and timed["unanswered"] == 1
    # wrk's read and write errors say nothing of requests (a closed keep-alive connection is
    # one too); a burst counts its users' requests.
    burst = wrk.summarize(result, sent=6, seconds=1.0, cpu_seconds=0.1, connections=6)
    assert burst["causes"] == {"grabbed": 6} and burst["unanswered"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_burst_from_wrk_is_answered_in_full_and_its_grabs_are_the_rows(
    make_users, sender, tmp_path
):
    assert wrk.available(), "wrk is not installed (apt-get install wrk)"
    users = make_users(USERS)
    tokens = [f"Bearer {AccessToken.for_user(u)}" for u in users]
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("20.00"),
        total_count=PACKETS,
        strategy="redis_counter",
        expires_in=3600,
    )
    # Every user at once on a connection of its own, one request each.
    burst = functools.partial(wrk.grab_run, tokens=tokens, once=True, connections=USERS, seconds=60)
    with gunicorn() as base:
        summary = burst(url=f"{base}/api/activities/{activity.pk}/grab/", log=tmp_path / "wrk.log")
        # The same shape against the ping (the hot burst's web ceiling): a GET each, all 200.
        pings = burst(url=f"{base}/api/ping/", log=tmp_path / "wrk-ping.log", method="GET")

    assert pings["statuses"] == {"200": USERS} and pings["unanswered"] == 0
    assert summary["causes"] == {"grabbed": PACKETS, "sold_out": USERS - PACKETS}
    assert summary["unanswered"] == 0 and summary["requests"] == USERS
    rows = GrabDetail.objects.filter(activity=activity).values_list("amount", flat=True)
    assert sorted(to_cents(a) for a in summary["granted"]) == sorted(to_cents(a) for a in rows)
    checked = wrk.audit_answers("redis_counter", activity.pk, summary["granted"], cut_off_at_most=0)
    assert checked["audit_ok"], checked["violations"]


@pytest.mark.skipif(wrk.available() is None, reason="wrk is not installed")
def test_a_request_lost_with_its_connection_stays_unanswered_and_no_user_grabs_twice(tmp_path):
    """A server that closes the first connection it gets without answering: wrk opens it again
    and asks the script for a new request. In a burst that must not be another user's grab (past
    the thread's share, a user grabbing twice): wrk_grab.lua sends GET /healthz instead, counted
    apart (`resent`), and the lost user's request is reported unanswered."""
    seen: list[bytes] = []

    def answer(request: bytes) -> bytes:
        line = request.split(b"\r\n", 1)[0]
        auth = [h for h in request.split(b"\r\n") if h.lower().startswith(b"authorization")]
        seen.append(line + b" " + (auth[0] if auth else b""))
        return b'{"status": "ok"}' if b"/healthz" in line else b'{"outcome": "sold_out"}'

    tokens = [f"Bearer user-{n}" for n in range(wrk.THREADS)]
    with dropping_grabs(1, answer) as port:
        summary = wrk.grab_run(
            url=f"http://127.0.0.1:{port}/api/activities/1/grab/",
            tokens=tokens,
            once=True,
            connections=len(tokens),
            seconds=3,
            log=tmp_path / "wrk.log",
        )
    grabs = [s for s in seen if b"/grab/" in s]
    assert len(grabs) == len(set(grabs)) == len(tokens) - 1  # each user at most once
    assert summary["resent"] >= 1
    assert summary["unanswered"] == 1 and summary["outcomes"] == {"sold_out": len(tokens) - 1}


@pytest.mark.skipif(wrk.available() is None, reason="wrk is not installed")
def test_requests_lost_with_their_connections_in_a_timed_run_are_unanswered(tmp_path):
    """A timed run (connections grabbing back to back) against a server that closes the
    connections of its first five grabs without answering: wrk goes on on new connections, and
    the lost requests are counted, not forgotten: beyond the one per connection that the stop
    may have cut off, each a `connection_error`."""
    lost, connections = 5, 2
    with dropping_grabs(lost, lambda request: b'{"outcome": "sold_out"}') as port:
        summary = wrk.grab_run(
            url=f"http://127.0.0.1:{port}/api/activities/1/grab/",
            tokens=[f"Bearer user-{n}" for n in range(100)],
            once=False,
            connections=connections,
            seconds=1,
            log=tmp_path / "wrk.log",
        )
    causes = summary["causes"]
    assert causes["sold_out"] > 0 and causes.get("cut_off", 0) <= connections
    assert causes.get("cut_off", 0) + causes["connection_error"] >= lost
    assert summary["unanswered"] == causes["connection_error"] >= lost - connections


@contextlib.contextmanager
def dropping_grabs(count: int, answer: Callable[[bytes], bytes]) -> Iterator[int]:
    """A server on a free port (yielded) that closes the connections of the first `count` grabs
    it gets without answering them, and answers every other request 200 with `answer(request)`
    as the JSON body."""
    dropped = itertools.count()
    lock = threading.Lock()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=on_connection, args=(conn,), daemon=True).start()

    def on_connection(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # wrk resets what is open when it stops
            while request := conn.recv(65536):
                if b"/grab/" in request.split(b"\r\n", 1)[0]:
                    with lock:
                        drop = next(dropped) < count
                    if drop:
                        return
                body = answer(request)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
