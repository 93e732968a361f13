"""The web server's worker class (redpack/webworker.py): a burst is split between the workers,
on a real gunicorn, with requests held open until the test lets them go."""

import socket
import subprocess
import sys
import uuid
from collections import Counter

import pytest
import redis
from django.conf import settings

from redpack import webworker

from .servers import ROOT, free_port, service_env, wait_for


@pytest.mark.parametrize(
    ("own", "others", "slack", "accepts"),
    [
        (0, [], 0, True),  # alone: always
        (5, [5], 0, True),  # as busy as the least busy
        (6, [5], 0, False),
        (6, [5], 1, True),
        (7, [5], 1, False),
        (40, [3, 90], 32, False),  # the least busy counts, not the average
        (35, [3, 90], 32, True),
    ],
)
def test_a_worker_accepts_while_no_busier_than_the_least_busy_plus_the_slack(
    own: int, others: list[int], slack: int, accepts: bool
) -> None:
    assert webworker.may_accept(own, others, slack) is accepts


def test_a_worker_that_is_gone_no_longer_counts() -> None:
    first = webworker.SLOTS - 1  # a worker's age picks its first slot: the last here
    slot = webworker._claim(999_999_001, first)
    other = webworker._claim(999_999_002, first)  # taken: the next free one, from the start
    try:
        assert slot == first and other != slot
        webworker._held[slot] = 7
        assert webworker._pids[slot] == 999_999_001
        webworker.forget(999_999_001)
        assert webworker._pids[slot] == 0 and webworker._held[slot] == 0
        assert webworker._claim(999_999_003, first) == slot  # free again
    finally:
        for pid in (999_999_001, 999_999_002, 999_999_003):
            webworker.forget(pid)


def test_a_burst_is_split_between_the_workers() -> None:
    """Twelve requests held open at once on two workers with a slack of one: a worker accepts
    only while it holds no more than the other plus one, so neither holds more than two above
    the other (gthread's own workers may take all twelve in one)."""
    requests, slack = 12, 1
    url = settings.CACHES["default"]["LOCATION"]
    key = f"test:held:{uuid.uuid4().hex}"
    client = redis.Redis.from_url(url)
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "tests.held_app:application"]
    command += ["--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "16"]
    server = subprocess.Popen(
        command,
        cwd=ROOT,
        env=service_env(
            HELD_APP_REDIS_URL=url,
            HELD_APP_KEY=key,
            REDPACK_WEB_ACCEPT_SLACK=str(slack),
        ),
    )
    sockets: list[socket.socket] = []
    try:
        for _ in range(2):  # both workers up: a burst before that goes to the first alone
            assert client.blpop([f"{key}:booted"], timeout=60) is not None, "a worker did not boot"
        wait_for(lambda: _listening(port), "gunicorn")
        for _ in range(requests):
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            sockets.append(sock)
        arrived: Counter[int] = Counter()
        for _ in range(requests):  # every request is running in a worker (16 threads each)
            popped = client.blpop([f"{key}:arrived"], timeout=60)
            assert popped is not None, f"{sum(arrived.values())} of {requests} arrived"
            arrived[int(popped[1])] += 1
        client.rpush(f"{key}:release", *range(requests))
        answered: Counter[int] = Counter()
        for sock in sockets:
            answer = _read_all(sock).split(b"\r\n\r\n", 1)[1].decode()
            pid, state = answer.split()
            assert state == "released"
            answered[int(pid)] += 1
    finally:
        for sock in sockets:
            sock.close()
        server.terminate()
        server.wait(timeout=30)
        client.delete(f"{key}:arrived", f"{key}:release", f"{key}:booted")
    assert answered == arrived
    assert len(arrived) == 2, arrived
    low, high = sorted(arrived.values())
    assert high - low <= slack + 1, arrived


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)
