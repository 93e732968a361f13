"""The web server's worker class (redpack/webworker.py): a burst is split between the workers,
on a real gunicorn, with requests held open until the test lets them go."""

import contextlib
import errno
import gc
import io
import json
import logging
import os
import resource
import runpy
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import pytest
import redis
from django.conf import settings
from gunicorn import http
from gunicorn.config import Config
from gunicorn.http import errors as http_errors

from redpack import logs, webworker

from .servers import (
    ROOT,
    Answers,
    free_port,
    gunicorn,
    python_child,
    raw_request,
    read_until_closed,
    service_env,
    wait_for,
)


@pytest.mark.parametrize(
    ("own", "others", "slack", "accepts"),
    [
        (0, [], 0, True),  # alone: always
        (5, [5], 0, True),  # as busy as the least busy
        (6, [5], 0, False),
        (6, [5], 1, True),
        (7, [5], 1, False),
        (6, [3, 90], 32, False),  # the least busy counts, not the average
        (5, [3, 90], 32, True),
        # The slack is at most a quarter of what the least busy holds, at least 2: the 16
        # connections a load generator opens at once are not all taken by one worker ...
        (2, [0], 256, True),
        (3, [0], 256, False),
        (12, [10], 256, True),
        (13, [10], 256, False),
        (250, [200], 256, True),
        (251, [200], 256, False),
        # ... and a burst of thousands within the slack.
        (2256, [2000], 256, True),
        (2257, [2000], 256, False),
    ],
)
def test_a_worker_accepts_while_no_busier_than_the_least_busy_plus_the_slack(
    own: int, others: list[int], slack: int, accepts: bool
) -> None:
    assert webworker.may_accept(own, others, slack) is accepts


def test_slots_are_claimed_one_per_worker_and_freed_when_it_exits() -> None:
    ages = [999_999_001, 999_999_002, 999_999_003]
    first, second = webworker.claim(ages[0]), webworker.claim(ages[1])
    try:
        assert first != second and -1 not in (first, second)
        webworker._held[first], webworker._ready[first] = 7, 1
        webworker.release(first)
        assert (webworker._owner[first], webworker._held[first], webworker._ready[first]) == (
            0,
            0,
            0,
        )
        assert webworker.claim(ages[2]) == first  # free again
    finally:
        for slot in range(webworker.SLOTS):
            if webworker._owner[slot] in ages:
                webworker.release(slot)


def _loop_of_one_worker(monkeypatch: pytest.MonkeyPatch, others: list[int]) -> Any:
    """A worker's loop state and nothing else (no server, no fork): a poller, its books, and
    the other workers holding `others`."""
    worker = webworker.BalancedThreadWorker.__new__(webworker.BalancedThreadWorker)
    worker.cfg, worker.slot, worker.nr_conns, worker.worker_connections = Config(), -1, 0, 10_000
    worker.alive, worker.log = True, logging.getLogger("gunicorn.error")
    worker.poller, worker._lock = selectors.DefaultSelector(), threading.RLock()
    worker._pending, worker._pending_lock = set(), threading.Lock()
    worker._unread, worker._unread_since, worker._accepted = set(), deque(), deque()
    worker._no_room_until = None
    worker._waits, worker._gathers = webworker._Deadlines(), True
    worker._answering, worker._keep = threading.local(), deque()
    monkeypatch.setattr(worker, "_others", lambda *_: others)
    return worker


def _close_all(worker: Any, *sockets: socket.socket | None) -> None:
    """Close what a test's worker loop holds (its poller's sockets, then the poller) and
    `sockets` (those that are not None)."""
    for key in list(worker.poller.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    for sock in sockets:
        if sock is not None:
            sock.close()
    worker.poller.close()


@pytest.mark.parametrize(
    ("slack", "others", "accepted"),
    # 256 while the other holds nothing: the floor, 2 more (3); a quarter of 20 (5) more than
    # 20 (26); alone: every one.
    [
        (256, [0], 3),
        (256, [100], 40),
        (3, [0], 3),
        (3, [2], 5),
        (256, [20], 26),
        (4, [20], 25),
        (3, [], 40),
    ],
)
def test_one_pass_accepts_every_waiting_connection_the_rule_allows(
    monkeypatch: pytest.MonkeyPatch, slack: int, others: list[int], accepted: int
) -> None:
    """gthread accepts one connection per pass of its loop, and a burst overflowed the kernel's
    listen queue meanwhile. A pass here takes all that wait, as long as the worker, counting
    each connection it accepted and has not read yet, holds no more than the least busy other
    worker plus the slack."""
    monkeypatch.setattr(webworker, "ACCEPT_SLACK", slack)
    worker = _loop_of_one_worker(monkeypatch, others)
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    listener.setblocking(False)
    clients = [socket.create_connection(listener.getsockname(), timeout=10) for _ in range(40)]
    try:
        wait_for(lambda: _waiting(listener) == 40, "the 40 connections in the listen queue")
        worker.accept(listener.getsockname(), listener)
        assert worker.nr_conns == accepted
        assert worker._holds() == accepted  # each counts until its request is read
        assert len(worker.poller.get_map()) == accepted  # each waits for its request
    finally:
        _close_all(worker, *clients, listener)


def test_a_long_pass_gives_the_listener_a_turn_between_its_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a burst one pass of the loop handles thousands of events; a worker that accepted once
    per pass let the listen queue overflow meanwhile. Once a pass has handled events for
    ACCEPT_TURN_SECONDS the listening socket gets a turn, only while the worker has room; a
    pass that takes no time asks the listener nothing."""
    worker = _loop_of_one_worker(monkeypatch, [])
    now = [100.0]
    monkeypatch.setattr(webworker, "clock", lambda: now[0])
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    listener.setblocking(False)
    worker.sockets = [listener]
    clients = [socket.create_connection(listener.getsockname(), timeout=10) for _ in range(3)]
    seen: list[int] = []  # connections the worker held as each event was handled

    def pass_of(events: int, seconds_each: float) -> None:
        def handled(_: Any) -> None:
            seen.append(worker.nr_conns)
            now[0] += seconds_each

        worker._serve([(SimpleNamespace(data=handled, fileobj=None), 0)] * events)

    try:
        wait_for(lambda: _waiting(listener) == 3, "the 3 connections in the listen queue")
        pass_of(50, 0.0)  # no time passes: the listener waits for the next pass
        assert seen == [0] * 50 and _waiting(listener) == 3

        seen.clear()
        worker._no_room_until = now[0] + 60  # no descriptor left: no turn
        pass_of(4, webworker.ACCEPT_TURN_SECONDS)
        assert seen == [0] * 4 and _waiting(listener) == 3

        seen.clear()
        worker._no_room_until = None
        pass_of(4, webworker.ACCEPT_TURN_SECONDS * 0.6)  # a turn after every second event
        assert seen == [0, 0, 3, 3]
        clients.append(socket.create_connection(listener.getsockname(), timeout=10))
        wait_for(lambda: _waiting(listener) == 1, "one more in the listen queue")
        pass_of(4, webworker.ACCEPT_TURN_SECONDS * 0.6)
        assert seen[4:] == [3, 3, 4, 4] and worker._holds() == 4
    finally:
        _close_all(worker, *clients, listener)


class _NoRoom:
    """A listening socket whose accept() finds no descriptor left in the process."""

    def accept(self) -> NoReturn:
        raise OSError(errno.EMFILE, "Too many open files")


def test_a_worker_without_room_says_so_once_and_leaves_the_queue_alone_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """accept() failing for want of descriptors (EMFILE): the connections stay in the listen
    queue, and the worker neither polls it again for NO_ROOM_SECONDS (it stays readable: the
    loop would spin on it) nor says so again until it has accepted a connection (measured
    before: 3.4 million warnings in one burst)."""
    worker = _loop_of_one_worker(monkeypatch, [])
    now = [100.0]
    monkeypatch.setattr(webworker, "clock", lambda: now[0])
    warnings: list[tuple[Any, ...]] = []
    worker.log = SimpleNamespace(warning=lambda *args: warnings.append(args))
    address = ("127.0.0.1", 0)

    worker.accept(address, _NoRoom())
    assert len(warnings) == 1 and worker.nr_conns == 0
    assert not worker._room()
    now[0] += webworker.NO_ROOM_SECONDS / 2
    worker.accept(address, _NoRoom())
    assert len(warnings) == 1  # still the same shortage
    now[0] += webworker.NO_ROOM_SECONDS * 3 / 4  # past the first refusal's wait ...
    assert not worker._room()  # ... counted from the last one
    now[0] += webworker.NO_ROOM_SECONDS
    assert worker._room()

    listener = socket.create_server(address)
    listener.setblocking(False)
    client = socket.create_connection(listener.getsockname(), timeout=10)
    try:
        wait_for(lambda: _waiting(listener) == 1, "the connection in the listen queue")
        worker.accept(listener.getsockname(), listener)
        assert worker.nr_conns == 1 and worker._room()
        worker.accept(address, _NoRoom())
        assert len(warnings) == 2  # a new shortage, said again
    finally:
        _close_all(worker, client, listener)


def test_a_stopping_worker_accepts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """What it took would be closed unanswered; in the listen queue it waits for the others."""
    worker = _loop_of_one_worker(monkeypatch, [])
    worker.alive = False
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    client = socket.create_connection(listener.getsockname(), timeout=10)
    try:
        wait_for(lambda: _waiting(listener) == 1, "the connection in the listen queue")
        worker.accept(listener.getsockname(), listener)
        assert worker.nr_conns == 0 and _waiting(listener) == 1
    finally:
        client.close()
        listener.close()


def test_a_listener_hands_over_a_connection_only_once_its_request_has_begun() -> None:
    """With `defer_accept`, a connection that has sent nothing stays in the kernel: the one
    behind it that sent its request is accepted first, its bytes already there, and the silent
    one is not accepted at all (without it the silent one came first, and its deadline ran
    while its request could still be on its way)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    webworker.defer_accept(listener)
    silent = socket.create_connection(listener.getsockname(), timeout=10)
    sending = socket.create_connection(listener.getsockname(), timeout=10)
    accepted: socket.socket | None = None
    try:
        sending.sendall(b"GET / HTTP/1.1\r\n")
        assert select.select([listener], [], [], 10)[0], "no connection to accept"
        accepted, peer = listener.accept()
        assert peer == sending.getsockname()
        accepted.setblocking(False)
        assert accepted.recv(100) == b"GET / HTTP/1.1\r\n"
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        for sock in (accepted, silent, sending, listener):
            if sock is not None:
                sock.close()


def test_a_unix_listener_and_a_server_without_a_read_deadline_defer_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tcp = socket.create_server(("127.0.0.1", 0))
    try:
        webworker.defer_accept(unix)  # no such option on a Unix socket: left alone
        monkeypatch.setattr(webworker, "READ_TIMEOUT", None)
        webworker.defer_accept(tcp)
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT) == 0
        monkeypatch.setattr(webworker, "READ_TIMEOUT", 10.0)
        webworker.defer_accept(tcp)
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT) > 0
    finally:
        unix.close()
        tcp.close()


def test_an_accepted_connection_that_sends_nothing_stops_counting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = _loop_of_one_worker(monkeypatch, [])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    client = socket.create_connection(listener.getsockname(), timeout=10)
    try:
        wait_for(lambda: _waiting(listener) == 1, "the connection in the listen queue")
        now = webworker.clock()
        monkeypatch.setattr(webworker, "clock", lambda: now)
        worker.accept(listener.getsockname(), listener)
        assert worker._holds() == 1
        monkeypatch.setattr(webworker, "clock", lambda: now + webworker.SILENT_SECONDS)
        worker._forget_silent()
        assert worker._holds() == 1  # not yet
        monkeypatch.setattr(webworker, "clock", lambda: now + webworker.SILENT_SECONDS + 0.01)
        worker._forget_silent()
        assert worker._holds() == 0
    finally:
        _close_all(worker, client, listener)


def test_a_kept_alive_connection_whose_next_request_came_is_served_not_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two kept-alive connections whose keep-alive ran out during a pass of the loop: the one
    whose client has sent its next request goes to a thread with it (gthread closed it unread,
    and the kernel reset it: a request without an answer); the idle one is closed, as gthread
    does."""
    worker = _loop_of_one_worker(monkeypatch, [])
    worker._keep = deque()
    served: list[Any] = []
    monkeypatch.setattr(worker, "enqueue_req", served.append)
    pairs = [socket.socketpair() for _ in range(2)]
    (asking_server, asking_client), (idle_server, idle_client) = pairs
    conns = []
    for server_side, _ in pairs:
        conn = webworker._Conn(worker.cfg, server_side, ("127.0.0.1", 0), ("127.0.0.1", 0))
        conn.initialized = True
        conn.timeout = 0.0  # ran out long ago
        worker._keep.append(conn)
        worker.poller.register(server_side, selectors.EVENT_READ)
        worker.nr_conns += 1
        conns.append(conn)
    try:
        request = b"POST /api/activities/1/grab/ HTTP/1.1\r\n\r\n"
        asking_client.sendall(request)
        worker.murder_keepalived()
        assert served == [conns[0]]  # to a thread, with its request (the loop read it)
        assert conns[0].early == request
        assert asking_server.fileno() != -1
        assert idle_server.fileno() == -1  # closed
        idle_client.settimeout(10)
        assert idle_client.recv(1) == b""  # the client sees the close, not a reset
        assert list(worker._keep) == [] and worker.nr_conns == 1
        assert not worker.poller.get_map()  # neither waits in the loop's poller any more
    finally:
        worker.poller.close()
        for server_side, client_side in pairs:
            server_side.close()
            client_side.close()


def test_a_kept_alive_connection_that_sends_no_request_is_refused_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its keep-alive ran out during a pass and what came is no HTTP request: a 400, and the
    connection leaves the keep-alive queue for good (counted once, closed once)."""
    worker = _loop_of_one_worker(monkeypatch, [])
    worker._keep = deque()
    server_side, client_side = socket.socketpair()
    with server_side, client_side:
        conn = webworker._Conn(worker.cfg, server_side, ("127.0.0.1", 0), ("127.0.0.1", 0))
        conn.initialized = True
        conn.timeout = 0.0  # ran out long ago
        worker._keep.append(conn)
        worker.poller.register(server_side, selectors.EVENT_READ)
        worker.nr_conns = 1
        client_side.sendall(b"\x16\x03\x01\x02\x00")
        worker.murder_keepalived()
        assert list(worker._keep) == [] and worker.nr_conns == 1  # lingering, still counted
        client_side.settimeout(10)
        assert client_side.recv(12) == b"HTTP/1.1 400"
        client_side.shutdown(socket.SHUT_WR)
        key = worker.poller.get_key(server_side)
        key.data(server_side)  # the loop reads the client's end
        assert worker.nr_conns == 0 and not worker.poller.get_map()
        worker.poller.close()


def _waiting(listener: socket.socket) -> int:
    """Connections in the listener's accept queue: a listening socket's rx_queue in
    /proc/net/tcp."""
    port = f"{listener.getsockname()[1]:04X}"
    with open("/proc/net/tcp") as table:
        for row in table.read().splitlines()[1:]:
            fields = row.split()
            if fields[1].endswith(f":{port}") and fields[3] == "0A":  # LISTEN
                return int(fields[4].split(":")[1], 16)
    return -1


@contextlib.contextmanager
def _held_app(
    *, workers: int, threads: int, soft_open_files: int | None = None, **env: str
) -> Iterator[tuple[int, str, "redis.Redis[bytes]"]]:
    """tests/held_app.py on a real gunicorn (with gunicorn.conf.py, as everywhere) once each of
    its `workers` has loaded it: (port, the app's Redis key prefix, a Redis client); stopped and
    its keys removed after. `soft_open_files`: the server starts at that soft limit."""
    url = settings.CACHES["default"]["LOCATION"]
    key = f"test:held:{uuid.uuid4().hex}"
    client = redis.Redis.from_url(url)
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "tests.held_app:application"]
    command += ["--bind", f"127.0.0.1:{port}", "--workers", str(workers), "--threads", str(threads)]
    env = service_env(HELD_APP_REDIS_URL=url, HELD_APP_KEY=key, **env)
    if soft_open_files is not None:
        command = ["sh", "-c", f'ulimit -Sn {int(soft_open_files)} && exec "$@"', "-", *command]
    server = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        for _ in range(workers):
            assert client.blpop([f"{key}:booted"], timeout=60) is not None, "a worker did not boot"
        yield port, key, client
    finally:
        server.terminate()
        server.wait(timeout=30)
        client.delete(f"{key}:arrived", f"{key}:release", f"{key}:booted")


@pytest.mark.parametrize(("threshold", "frozen"), [("5000", True), ("0", False)])
def test_a_worker_freezes_its_loaded_app_and_collects_less_often(
    threshold: str, frozen: bool
) -> None:
    """gunicorn.conf.py settles each worker's collector once the app is loaded
    (webworker.settle_collector): what it loaded is frozen and the youngest generation is
    collected every REDPACK_WEB_GC_THRESHOLD allocations; 0 leaves Python's collector as it
    was."""
    with _held_app(workers=1, threads=2, REDPACK_WEB_GC_THRESHOLD=threshold) as (port, _, _):
        # The worker serves its first request once post_worker_init has run (the listening
        # socket is the master's: the connection waits in its queue until then).
        answer = _get(port, "/collector")
    objects, youngest = (int(field) for field in answer.split())
    if frozen:
        assert objects > 10_000  # at least the app's modules and what they hold
        assert youngest == 5000
    else:
        assert objects == 0
        own = subprocess.run(
            [sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert youngest == int(own.stdout)  # the interpreter's own


def test_a_server_started_at_a_low_soft_limit_of_open_files_raises_it_for_its_workers() -> None:
    """A burst needs a descriptor per connection: gunicorn.conf.py raises the soft limit of
    open files of a server started at the common 1,024 towards worker_connections plus the
    margin (webworker.open_files_for), as far as the hard limit goes, before its workers fork
    (docs/benchmarks.md, "Open files")."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    configured = runpy.run_path(str(ROOT / "gunicorn.conf.py"))["worker_connections"]
    wanted = configured + webworker.OPEN_FILES_MARGIN
    expected = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if expected <= 1024:
        pytest.skip(f"the hard limit of open files here ({hard}) leaves nothing to raise")
    with _held_app(workers=1, threads=2, soft_open_files=1024) as (port, _, _):
        assert int(_get(port, "/open-files")) == expected


@pytest.mark.parametrize("refusal", [ValueError("not allowed"), OSError(1, "denied")])
def test_a_limit_the_kernel_refuses_to_raise_stays_as_it_was(
    monkeypatch: pytest.MonkeyPatch, refusal: Exception
) -> None:
    """setrlimit may refuse what the hard limit seems to allow (a system cap below it, macOS's
    OPEN_MAX, a sandbox): the server starts anyway, holding what the limit it has allows."""
    asked: list[tuple[int, int]] = []

    def refuse(which: int, limits: tuple[int, int]) -> None:
        asked.append(limits)
        raise refusal

    monkeypatch.setattr(webworker.resource, "getrlimit", lambda which: (1024, 20_000))
    monkeypatch.setattr(webworker.resource, "setrlimit", refuse)
    assert webworker.open_files_for(10_000) == 1024 - webworker.OPEN_FILES_MARGIN
    assert asked == [(10_000 + webworker.OPEN_FILES_MARGIN, 20_000)]


@pytest.mark.parametrize(("cap", "said"), [(128, 1), (4096, 0), (None, 0)])
def test_a_server_says_when_the_kernel_caps_its_listen_queue_below_its_backlog(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cap: int | None, said: int
) -> None:
    """net.core.somaxconn (128 before Linux 5.4) silently shortens the 4,096 of `backlog`:
    gunicorn.conf.py says so at start, with the fix; nothing where the cap cannot be read."""
    somaxconn = tmp_path / "somaxconn"
    if cap is not None:
        somaxconn.write_text(f"{cap}\n")
    monkeypatch.setattr(webworker, "SOMAXCONN", str(somaxconn))
    hooks = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    config = Config()
    config.set("backlog", hooks["backlog"])
    warnings: list[tuple[Any, ...]] = []
    server = SimpleNamespace(cfg=config, log=SimpleNamespace(warning=lambda *a: warnings.append(a)))
    hooks["say_if_the_queue_is_capped"](server)
    assert len(warnings) == said
    assert all(f"net.core.somaxconn={hooks['backlog']}" in w[0] % w[1:] for w in warnings)


@pytest.mark.parametrize(("threads", "said"), [(1, 0), (1_000_000, 1)])
def test_a_server_says_when_mysql_cannot_hold_a_connection_for_each_of_its_threads(
    threads: int, said: int
) -> None:
    """Each web thread keeps a MySQL connection: gunicorn.conf.py says at start when the real
    MariaDB's max_connections leaves room for fewer than the workers' threads, with the fix."""
    hooks = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    config = Config()
    config.set("workers", 2)
    config.set("threads", threads)
    warnings: list[tuple[Any, ...]] = []
    log = SimpleNamespace(warning=lambda *a: warnings.append(a), debug=lambda *a, **k: None)
    hooks["say_if_mysql_is_short"](SimpleNamespace(cfg=config, log=log)).join()
    assert bool(warnings) is bool(said)
    assert all("raise max_connections" in w[0] for w in warnings)


MASTER_AT_START = """
import runpy, sys
from types import SimpleNamespace
from gunicorn.config import Config
hooks = runpy.run_path("gunicorn.conf.py")
log = SimpleNamespace(warning=print, debug=print)
hooks["say_if_mysql_is_short"](SimpleNamespace(cfg=Config(), log=log))
print("settings loaded" if "redpack.settings" in sys.modules else "settings not loaded")
"""


def test_the_master_never_loads_the_app_settings_to_check_mysql() -> None:
    """The check runs in a child process: a master that loaded the settings would hand them to
    the workers of a reload, which must read them anew."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = python_child(MASTER_AT_START, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "settings not loaded"


HOOK_UNDER_A_HARD_LIMIT = """
import resource, runpy, sys
from types import SimpleNamespace
from gunicorn import http
from gunicorn.config import Config
from gunicorn.http import errors as http_errors
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1500))
hooks = runpy.run_path("gunicorn.conf.py")
said = []
def say(message, *args):  # the open files' messages (not the listen queue's, say)
    said.extend([message] if message.startswith("open files") else [])
log = SimpleNamespace(warning=say, error=say)
def server():  # as gunicorn's master holds it at start, and after a reload (a new config)
    config = Config()
    config.set("worker_connections", hooks["worker_connections"])
    return SimpleNamespace(cfg=config, log=log)
started, reloaded = server(), server()
hooks["on_starting"](started)
hooks["on_reload"](reloaded)
hooks["on_exit"](started)
soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
print(soft, started.cfg.worker_connections, reloaded.cfg.worker_connections, len(said))
"""


def test_under_a_low_hard_limit_a_worker_holds_no_more_connections_than_it_has_files() -> None:
    """Under a hard limit below worker_connections (1,500 here), gunicorn.conf.py takes the soft
    limit up to it, lowers worker_connections to that less the margin (what a worker's own
    MySQL and Redis connections need: a request that cannot open one would fail), and says so
    once; again after a reload (SIGHUP), which reads the config anew (docs/benchmarks.md,
    "Open files")."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1500:
        pytest.skip(f"the hard limit of open files here ({hard}) is below 1,500")
    done = subprocess.run(
        [sys.executable, "-c", HOOK_UNDER_A_HARD_LIMIT],
        cwd=ROOT,
        env=service_env(REDPACK_WEB_CONNECTIONS="10000"),
        capture_output=True,
        text=True,
        check=True,
    )
    soft, started, reloaded, said = (int(field) for field in done.stdout.split())
    holds = 1500 - webworker.OPEN_FILES_MARGIN
    assert (soft, started, reloaded, said) == (1500, holds, holds, 2)  # once each


def test_a_burst_is_split_between_the_workers() -> None:
    """Twelve requests held open at once on two workers with a slack of one: a worker accepts
    only while it holds no more than the other plus one, so neither holds more than a few above
    the other (gthread's own workers took all twelve in one); once answered, the workers hold
    nothing."""
    requests, slack = 12, 1
    sockets: list[socket.socket] = []
    with _held_app(workers=2, threads=16, REDPACK_WEB_ACCEPT_SLACK=str(slack)) as held:
        port, key, client = held
        try:
            # Both workers in their loops: each has answered a request.
            seen: set[int] = set()
            wait_for(lambda: bool(seen.update(_hellos(port, 4))) or len(seen) == 2, "both workers")
            for _ in range(requests):
                sock = socket.create_connection(("127.0.0.1", port), timeout=60)
                sock.sendall(b"GET /held-open HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
                sockets.append(sock)
            arrived: Counter[int] = Counter()
            for _ in range(requests):  # every request is running in a worker (16 threads each)
                popped = client.blpop([f"{key}:arrived"], timeout=60)
                assert popped is not None, f"{sum(arrived.values())} of {requests} arrived"
                arrived[int(popped[1])] += 1
            client.rpush(f"{key}:release", *range(requests))
            answered: Counter[int] = Counter()
            for sock in sockets:
                pid, state = _body(sock).split()
                assert state == "released"
                answered[int(pid)] += 1
            # Every request answered leaves the books: only the asking one is held.
            wait_for(lambda: _get(port, "/held") == "1", "the workers to hold nothing")
        finally:
            for sock in sockets:
                sock.close()
    assert answered == arrived
    assert len(arrived) == 2, arrived
    low, high = sorted(arrived.values())
    # At most one more than the rule allows: a worker may accept a connection before it has
    # read the request of the one it accepted just before.
    assert high - low <= slack + 2, arrived


@pytest.mark.parametrize(
    ("own", "others", "slack", "over"),
    [
        (16, [], 256, 0),  # alone: never
        (4, [0], 256, 0),  # the floor (2) and the margin (2) above the least busy
        (5, [0], 256, 1),
        (64, [0], 256, 32),  # at most half the gap
        (36, [28], 256, 0),  # a quarter of the least busy (7) and the margin
        (38, [26], 256, 4),
        (2258, [2000], 256, 0),  # thousands: the slack and the margin
        (2259, [2000], 256, 1),
    ],
)
def test_a_worker_is_crowded_past_what_it_may_accept_by_more_than_the_margin(
    own: int, others: list[int], slack: int, over: int
) -> None:
    assert webworker.crowded(own, others, slack) == over


def _request_on(sock: socket.socket, answers: Answers, path: str, body: bytes = b"") -> Any:
    """One request on a kept-alive connection: its answer's body, and whether the server closes
    the connection after it (`Connection: close`)."""
    length = f"Content-Length: {len(body)}\r\n".encode() if body else b""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n".encode() + length + b"\r\n" + body)
    status, headers, answer = answers.next()
    assert status == 200
    return answer.decode(), headers.get("connection", "").lower() == "close"


def test_a_crowded_worker_moves_a_kept_alive_connection_to_another() -> None:
    """A kept-alive connection stays with the worker that accepted it: a client whose
    connections all went to one worker (the other still booting) kept them there. A worker
    whose busy connections of the last second outnumber the other's by more than its allowance
    and the margin answers every eighth request on a connection, if it has no body, with
    `Connection: close`, as many as it is over; the client's next connection goes to a worker
    that accepts. A request with a body, or one of a client that has sent a request before the
    answer to the one before, keeps its connection."""
    with _held_app(workers=2, threads=16) as held:
        port, key, client = held
        seen: set[int] = set()
        wait_for(lambda: bool(seen.update(_hellos(port, 4))) or len(seen) == 2, "both workers")
        # Kept-alive connections, each on the worker that took it (one request each so far).
        on: dict[str, list[tuple[socket.socket, Answers]]] = {str(pid): [] for pid in seen}
        opened: list[socket.socket] = []
        try:
            while len(min(on.values(), key=len)) < 10:
                assert len(opened) < 400, {pid: len(held) for pid, held in on.items()}
                sock = socket.create_connection(("127.0.0.1", port), timeout=60)
                opened.append(sock)
                answers = Answers(sock)
                pid, closed = _request_on(sock, answers, "/hello")
                assert not closed
                on[pid].append((sock, answers))
            crowded_pid, other_pid = sorted(on)
            kept, with_body, pipelining, *holders = on[crowded_pid][:10]
            # Two requests sent together on one connection of each worker: their clients do not
            # wait for answers, and they are never closed to move them (`calm` asks the test's
            # questions, whichever worker is crowded meanwhile).
            (calm, calm_answers), *_ = on[other_pid]
            for sock, answers in (pipelining, (calm, calm_answers)):
                sock.sendall(b"GET /hello HTTP/1.1\r\nHost: test\r\n\r\n" * 2)
                assert [answers.next()[0] for _ in range(2)] == [200, 200]
            # Seven answers on three of the crowded worker's connections.
            for (sock, answers), more in ((kept, 6), (with_body, 6), (pipelining, 4)):
                for _ in range(more):
                    assert _request_on(sock, answers, "/hello") == (crowded_pid, False)
            # Seven requests held open on the crowded worker: busy in every period, against
            # the other's one (`calm`, which the test asks) or none.
            for sock, _ in holders:
                sock.sendall(b"GET /held-open HTTP/1.1\r\nHost: test\r\n\r\n")
            for _ in holders:
                popped = client.blpop([f"{key}:arrived"], timeout=60)
                assert popped is not None and popped[1].decode() == crowded_pid
            wait_for(
                lambda: _request_on(calm, calm_answers, "/busy")[0] in ("0 7", "1 7"),
                "a period of the held requests alone, and of `calm`",
            )
            # The eighth answers: kept for a body, and for the client that does not wait; the
            # next closes its connection, and its client's next one goes to the other worker
            # (the first holds more than it may accept).
            assert _request_on(*with_body, "/hello", b"{}") == (crowded_pid, False)
            assert _request_on(*pipelining, "/hello") == (crowded_pid, False)
            assert _request_on(*kept, "/hello") == (crowded_pid, True)
            assert read_until_closed(kept[0]) == b""  # closed after its answer
            with socket.create_connection(("127.0.0.1", port), timeout=60) as again:
                assert _request_on(again, Answers(again), "/hello")[0] == other_pid
            client.rpush(f"{key}:release", *range(len(holders)))
            for _, answers in holders:
                assert answers.next()[0] == 200
        finally:
            client.rpush(f"{key}:release", *range(10))  # none held past a failure
            for sock in opened:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def _get(port: int, path: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())
        return _body(sock)


def _hellos(port: int, count: int) -> set[int]:
    """The pids that answered `count` /hello requests sent together."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(count)]
    try:
        for sock in socks:
            sock.sendall(b"GET /hello HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        return {int(_body(sock)) for sock in socks}
    finally:
        for sock in socks:
            sock.close()


def _body(sock: socket.socket) -> str:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks).split(b"\r\n\r\n", 1)[1].decode()


MALFORMED = [
    # (request, status, the field its answer names)
    (
        b"GET /api/ping/ HTTP/1.1\r\nHost: x\r\nAuthorization: " + b"a" * 20_000 + b"\r\n\r\n",
        431,
        "headers",
    ),
    (
        b"GET /api/ping/ HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%d: 1\r\n" % i for i in range(150))
        + b"\r\n",
        431,
        "headers",
    ),
    (
        b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        400,
        "Content-Length",
    ),
    (
        b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        400,
        "Content-Length",
    ),
    (
        b"GET /api/activities/" + b"9" * 5_000 + b"/ HTTP/1.1\r\nHost: x\r\n\r\n",
        400,
        "request_line",
    ),
    (b"GET /api/ping/ HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400, "headers"),
    (b"G@T /api/ping/ HTTP/1.1\r\nHost: x\r\n\r\n", 400, "method"),
    (b"GET /api/ping/ HTTP/9.9\r\nHost: x\r\n\r\n", 400, "http_version"),
]


REFUSED_HEADS = [
    # (request, status line, the field its answer names): RFC 9112 refusals gunicorn let pass
    (b"GET /api/ping/ HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 Bad Request", "Host"),  # 3.2
    (b"GET /api/ping/ HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", b"HTTP/1.1 400 Bad Request", "Host"),
    (  # 6.3: where the body ends cannot be known (gunicorn took it as none)
        b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"
        b"GET /api/ping/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 400 Bad Request",
        "Transfer-Encoding",
    ),
    (  # 6.3 again, for codings gunicorn does not know (it answered 501): not chunked last
        b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n",
        b"HTTP/1.1 400 Bad Request",
        "Transfer-Encoding",
    ),
    (
        b"POST /api/activities/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked;q=1\r\n\r\n",
        b"HTTP/1.1 400 Bad Request",
        "Transfer-Encoding",
    ),
    (
        b"POST /api/activities/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \r\n\r\n",
        b"HTTP/1.1 400 Bad Request",
        "Transfer-Encoding",
    ),
    (  # one it does not know before chunked, in the same header or another: the same 400
        b"POST /api/activities/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: br, chunked\r\n\r\n",
        b"HTTP/1.1 400 Bad Request",
        "Transfer-Encoding",
    ),
    (
        b"POST /api/activities/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: br\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 400 Bad Request",
        "Transfer-Encoding",
    ),
    (  # a trusted proxy's SCRIPT_NAME the path is not under (gunicorn: 500)
        b"GET /api/ping/ HTTP/1.1\r\nHost: x\r\nSCRIPT_NAME: /elsewhere\r\n\r\n",
        b"HTTP/1.1 400 Bad Request",
        "SCRIPT_NAME",
    ),
    (  # a control byte in a header's value; one Python's strip() took for a space (gunicorn:
        # chunked, where a proxy may see no chunked body), and a byte past ASCII before it
        b"GET /api/ping/ HTTP/1.1\r\nHost: x\r\nX-Note: a\x01b\r\n\r\n",
        b"HTTP/1.1 400 Bad Request",
        "X-Note",
    ),
    *(
        (
            b"POST /api/ping/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: %schunked%s\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" % around,
            b"HTTP/1.1 400 Bad Request",
            "Transfer-Encoding",
        )
        for around in [(b"\x0b", b""), (b"\x1f", b""), (b"\xa0", b""), (b"", b"\x85")]
    ),
    *(  # chunks a proxy may read otherwise: an extension that is none, a size that is none
        (
            b"POST /api/ping/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunks
            + b"0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
            b"HTTP/1.1 400 Bad Request",
            "body",
        )
        for chunks in [
            b"2;\nab\r\n",
            b"2;\x00\r\nab\r\n",
            b"2; a=\x7f\r\nab\r\n",
            b'2;a="open\r\nab\r\n',
            b"2;\r\nab\r\n",
            b"2;=1\r\nab\r\n",
            b"zz\r\nab\r\n",
        ]
    ),
    *(  # a request line with a tab, a byte past ASCII, a CR alone before it
        (line + b"\r\nHost: x\r\n\r\n", b"HTTP/1.1 400 Bad Request", "request_line")
        for line in [
            b"GET /heal\tthz HTTP/1.1",
            b"GET /api/\xc3\xa9 HTTP/1.1",
            b"\rGET /healthz HTTP/1.1",
            b"\r\n\rGET /healthz HTTP/1.1",
        ]
    ),
    (b"GET /" + b"a" * webworker.LINE_BYTES, b"HTTP/1.1 400 Bad Request", "request_line"),
    (
        b"GET /api/ping/ HTTP/1.1\r\nHost: x\r\nX: " + b"a" * webworker.HEAD_BYTES,
        b"HTTP/1.1 431 Request Header Fields Too Large",
        "headers",
    ),
]


def test_heads_a_server_must_refuse_are_refused_once_and_closed():
    """Each is answered once, in JSON naming what was wrong, and its connection closed: not a
    pipelined request behind it answered (a head without its end, the last two, is refused from
    the loop as soon as it is too long: no thread waits for its end)."""
    with gunicorn(workers=1, threads=1, REDPACK_WEB_READ_TIMEOUT="600") as base:
        host, port = base.removeprefix("http://").split(":")
        for request, status_line, field in REFUSED_HEADS:
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(request)
                answer = read_until_closed(sock)
            assert answer.startswith(status_line + b"\r\n"), (request[:70], answer[:70])
            answers = Answers(io.BufferedReader(io.BytesIO(answer)))  # type: ignore[arg-type]
            _, headers, body = answers.next()
            assert headers["connection"] == "close"
            assert list(json.loads(body)["error"]["fields"]) == [field], request[:70]
            assert answers.until_closed() == []  # nothing more: the request behind it unread


REFUSED_HEAD_REQUESTS = [
    # (request, status): refused by gunicorn's parser with the request (a bad Content-Length)
    # and without one (too many headers), by the loop (a head too long), and timed out (408)
    (b"HEAD /api/ping/ HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
    (b"HEAD /api/ping/ HTTP/1.1\r\nHost: x\r\n" + b"X-N: a\r\n" * 120 + b"\r\n", 431),
    (b"HEAD /api/ping/ HTTP/1.1\r\nHost: x\r\nX: " + b"a" * webworker.HEAD_BYTES, 431),
    (b"HEAD /api/ping/ HTTP/1.1\r\nHost: x\r\n", 408),
]


def test_a_refused_head_request_is_answered_without_a_body():
    """Its status and headers, Content-Length included, and nothing after them: a client that
    keeps its connection would read a body as the start of its next answer."""
    with gunicorn(workers=1, threads=1, REDPACK_WEB_READ_TIMEOUT="1") as base:
        host, port = base.removeprefix("http://").split(":")
        for request, status in REFUSED_HEAD_REQUESTS:
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(request)
                answer = read_until_closed(sock)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 %d " % status), (request[:60], head)
            assert b"Content-Length: " in head
            assert body == b"", request[:60]


TARGETS = [
    # (method and request target, status, the JSON error's field or None, Allow or None)
    (b"OPTIONS *", 204, None, "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
    (b"GET *", 400, "target", None),
    (b"CONNECT example.com:443", 405, "method", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
    (b"GET example.com", 400, "target", None),
    # An absolute URL's host is the request's (RFC 9112 3.2.2), whatever the Host header says.
    (b"GET http://evil.example/api/ping/", 400, "Host", None),
    (b"GET http://127.0.0.1/api/ping/", 401, None, None),  # served: the ping wants its token
    # No request target has a fragment; read past it, the host was the one after the `@`.
    (b"GET http://evil.example#@127.0.0.1/api/ping/", 400, "target", None),
    (b"GET http://127.0.0.1#@evil.example/api/ping/", 400, "target", None),
    (b"GET http://evil.example@127.0.0.1/api/ping/", 400, "target", None),  # userinfo: an error
    (b"GET /API/ping/", 404, None, None),  # paths are case-sensitive; the API's shape anyway
]


def test_a_request_target_that_is_not_a_path_is_answered_as_the_rfc_asks_in_json():
    with gunicorn(workers=1, threads=2) as base:
        for target, status, field, allow in TARGETS:
            request = target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            got, headers, body = raw_request(base, request)
            assert got == status, (target, body[:200])
            if allow is not None:
                assert headers["allow"] == allow, target
            if status == 204:
                assert body == b"" and "content-type" not in headers
            elif status != 401:
                assert headers["content-type"] == "application/json", target
                assert int(headers["content-length"]) == len(body)
                error = json.loads(body)["error"]
                assert list(error["fields"]) == ([field] if field else []), (target, error)


def test_a_refused_connect_closes_its_connection():
    """What its client sends after it, without waiting for the answer, is its tunnel's, not a
    request: the 405, then the connection closed (the request behind it was answered)."""
    with _one_connection() as sock:
        sock.sendall(
            b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n"
            b"GET /nowhere/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        answers = Answers(sock)
        status, headers, _ = answers.next()
        assert (status, headers["connection"]) == (405, "close")
        assert answers.until_closed() == []


def test_a_later_http_1_minor_version_is_answered_as_http_1_1():
    """RFC 9110 2.5: the server answers in the version it speaks (gunicorn echoed 1.2)."""
    with gunicorn(workers=1, threads=1) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.2\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_until_closed(sock).startswith(b"HTTP/1.1 ")


def test_a_request_gunicorn_refuses_is_answered_in_json_naming_what_was_wrong():
    with gunicorn(workers=1, threads=4) as base:
        for request, status, field in MALFORMED:
            got, headers, body = raw_request(base, request)
            assert (got, headers["content-type"]) == (status, "application/json"), request[:60]
            error = json.loads(body)["error"]
            assert error["code"] in {"bad_request", "request_headers_too_large"}
            assert list(error["fields"]) == [field], (request[:60], error)
            assert len(error["message"]) <= 200


STALLS = [
    b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # the head, never ended
    b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
    b"POST /api/token/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b'Content-Length: 1000\r\n\r\n{"username": ',  # the body, never ended
]


def test_requests_that_come_slowly_hold_no_thread():
    """A request goes to a thread once all of it has come (its head, and its body up to the
    app's limit); until then it waits in the worker's loop. With gthread a thread waited on each
    client that had sent a first byte: a few dozen clients sending requests slowly, or only
    their start, held every thread and stalled everybody else (seen: a minute). Here the one
    thread of the worker answers another client while requests that never end and a connection
    that sends nothing wait, and a request that ends late is answered."""
    with gunicorn(workers=1, threads=1, REDPACK_WEB_READ_TIMEOUT="600") as base:
        host, port = base.removeprefix("http://").split(":")
        stalled = [
            socket.create_connection((host, int(port)), timeout=60) for _ in range(len(STALLS) + 2)
        ]
        try:
            for sock, start in zip(
                stalled, [*STALLS, b"GET /api/ping/ HTTP/1.1\r\n"], strict=False
            ):
                sock.sendall(start)
            for _ in range(2):
                status, _, body = raw_request(
                    base, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                assert status in (200, 503) and json.loads(body)["status"], body
            late = stalled[len(STALLS)]
            late.sendall(b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert Answers(late).until_closed() == [401]  # the ping's, without a token
        finally:
            for sock in stalled:
                sock.close()


def test_a_request_that_does_not_come_in_time_is_answered_408_and_its_connection_closed():
    """Past REDPACK_WEB_READ_TIMEOUT from its first byte, a request that has not come in full
    (mid-head, mid-body) gets a 408 in the API's JSON shape and the end of its connection; a
    connection that sent nothing within REDPACK_WEB_FIRST_BYTE_TIMEOUT of its accept is closed
    without a word (gthread kept it open for ever: a few thousand such connections filled every
    worker)."""
    with gunicorn(
        workers=1, threads=2, REDPACK_WEB_READ_TIMEOUT="1", REDPACK_WEB_FIRST_BYTE_TIMEOUT="2"
    ) as base:
        host, port = base.removeprefix("http://").split(":")
        stalled = [socket.create_connection((host, int(port)), timeout=30) for _ in STALLS]
        with socket.create_connection((host, int(port)), timeout=30) as silent:
            try:
                for sock, start in zip(stalled, STALLS, strict=True):
                    sock.sendall(start)
                for sock in stalled:
                    answer = read_until_closed(sock)
                    head, _, body = answer.partition(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 408 "), answer[:80]
                    assert b"\r\nConnection: close\r\n" in head + b"\r\n", head
                    assert json.loads(body)["error"]["code"] == "request_timeout"
                assert read_until_closed(silent) == b""
            finally:
                for sock in stalled:
                    sock.close()


def test_a_client_that_sends_a_byte_now_and_then_loses_its_connection():
    """A request must arrive in full within REDPACK_WEB_READ_TIMEOUT, however often its client
    sends a byte (slow loris): the server answers 408 and closes the connection before the
    client has sent the head it trickles, and serves the next request meanwhile."""
    trickle = b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 300
    with gunicorn(workers=1, threads=1, REDPACK_WEB_READ_TIMEOUT="1") as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sent = 0
            # One byte, then a tenth of a second's wait for the server to close (readable,
            # nothing to read), again: 300 bytes would take 30 s, thirty times the limit.
            while sent < len(trickle):
                sock.sendall(trickle[sent : sent + 1])
                sent += 1
                readable, _, _ = select.select([sock], [], [], 0.1)
                if readable:
                    assert read_until_closed(sock).startswith(b"HTTP/1.1 408 ")
                    break
            assert sent < len(trickle), "the server waited for the whole trickle"
        status, _, _ = raw_request(
            base, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        assert status in (200, 503)


def test_a_body_cut_by_the_limit_closes_its_connection_after_the_answer():
    """Its 408 comes, and then the end of the connection: the rest of the body, sent late,
    is never read as a request of its own."""
    head = (
        b"POST /api/token/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 40\r\n\r\n"
    )
    start = b'{"username": '
    rest = b'"x", "password": "y"}'.ljust(40 - len(start))
    later = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with gunicorn(workers=1, threads=2, REDPACK_WEB_READ_TIMEOUT="1") as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head + start)
            answer = read_until_closed(sock)  # the server stops writing after its answer
            with contextlib.suppress(OSError):
                sock.sendall(rest + later)
            answer += read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    assert b"\r\nConnection: close\r\n" in answer.partition(b"\r\n\r\n")[0], answer[:300]
    assert answer.count(b"HTTP/1.1 ") == 1, answer


@contextlib.contextmanager
def _one_connection() -> Iterator[socket.socket]:
    """A connection to a server of one worker with two threads."""
    with gunicorn(workers=1, threads=2) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            yield sock


def test_requests_sent_together_on_one_connection_are_all_answered_in_order():
    """HTTP pipelining: a client (wrk with a pipelining script, say) sends its next requests
    without waiting for the answers. gthread answered the first and then waited for the socket
    to become readable, which it never did (the rest was in its parser's buffer): the others
    went unanswered and the connection was closed when its keep-alive ran out. A body the view
    does not read (the grab's) or reads (the login's) is passed over, not read as a request."""
    together = (
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 14\r\n\r\n"
        b"GET / HTTP/1.1"  # a body, not a request
        b"POST /api/token/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\n\r\n{}"
        b"GET /nowhere/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    with _one_connection() as sock:
        sock.sendall(together)
        statuses = Answers(sock).until_closed()
    assert len(statuses) == 4, statuses
    assert statuses[0] in (200, 503)  # /healthz, whatever the services' state
    assert statuses[1:] == [401, 400, 404]


def test_the_rest_of_a_body_still_on_its_way_is_not_read_as_the_next_request():
    """A grab's body comes in two pieces: the request waits in the loop for the second (another
    client is answered meanwhile), and no part of that body is read as a request of its own;
    the request after it on the connection is answered."""
    head = b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 30\r\n\r\n"
    first, rest = b"GET /nowhere/ HTT", b"P/1.1\r\n\r\n\r\n\r\n"
    assert len(first + rest) == 30
    later = b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with gunicorn(workers=1, threads=1) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head + first)
            status, _, _ = raw_request(
                base, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            assert status in (200, 503)
            sock.sendall(rest + later)
            assert Answers(sock).until_closed() == [401, 401]  # the grab's, the ping's


def test_requests_behind_a_chunked_body_are_answered_in_turn():
    """The grab and the ping read no body: one sent in chunks (here with a trailer) is passed
    over whole, and the requests sent with it are answered, or after it when its last chunk
    comes later: the loop waits for it, and no piece of it is read as a request."""
    chunked = (
        b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
    )
    chunks = b"5\r\nGET /\r\n7\r\nnowhere\r\n"
    end = b"0\r\nX-Sum: 1\r\n\r\n"
    ping = b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    last = b"GET /nowhere/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with _one_connection() as sock:
        sock.sendall(chunked + chunks + end + ping + chunked + chunks + end + last)
        assert Answers(sock).until_closed() == [401, 401, 401, 404]
    with _one_connection() as sock:
        sock.sendall(chunked + chunks)
        sock.sendall(end + last)
        assert Answers(sock).until_closed() == [401, 404]


def test_an_answer_to_head_has_no_body_and_the_next_answer_is_read_whole():
    """HEAD gets the status and headers a GET would, Content-Length included, and no body:
    sent, a body was read by the client as the start of its next answer on the connection."""
    together = (
        b"HEAD /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        b"HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    with _one_connection() as sock:
        sock.sendall(together)
        answers = Answers(sock)
        head = answers.next("HEAD")
        get = answers.next()
        health_head, health = answers.next("HEAD"), answers.next()
        rest = answers.read()
    assert (head[0], get[0]) == (401, 401)
    assert json.loads(get[2])["error"]["code"] == "not_authenticated"
    assert head[1]["content-length"] == str(len(get[2]))  # as a GET's
    assert health_head[0] in (200, 503) and health[0] in (200, 503)
    assert json.loads(health[2])["status"], health
    assert rest == b""  # nothing after the last answer


def _parsed(sent: bytes) -> Any:
    """gunicorn's parser over a socket on which `sent` came, after the first request's head."""
    server_side, client_side = socket.socketpair()
    with server_side, client_side:
        client_side.sendall(sent)
        parser = http.RequestParser(Config(), server_side, ("127.0.0.1", 0))
        assert next(parser).path == "/api/activities/1/grab/"  # the rest read with it
        return parser


CHUNKED_GRAB = (
    b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


@pytest.mark.parametrize(
    "rest",
    [
        b"5\r\nhel",
        b"5\r\nhello",
        b"5\r\nhello\r",
        b"5\r\nhello\r\n0\r\n",
        b"5\r\nhello\r\n0\r\nX: 1\r\n",
    ],
)
def test_a_chunked_body_still_on_its_way_is_left_to_the_loop(rest: bytes) -> None:
    """Not all of it has come (whatever gunicorn's parser makes of its end): no next request
    yet, and nothing read or refused; the loop waits for the socket."""
    parser = _parsed(CHUNKED_GRAB + rest)
    assert webworker.next_request_read(parser) is False
    assert parser.unreader.buf.getvalue() == rest


def test_a_whole_chunked_body_is_passed_over_to_the_request_behind_it() -> None:
    parser = _parsed(CHUNKED_GRAB + b"5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n")
    assert webworker.next_request_read(parser) is True
    assert parser.unreader.buf.getvalue() == b"GET / HTTP/1.1\r\n\r\n"


def test_a_malformed_chunked_body_closes_its_connection_at_once():
    """Where the next request begins is unknown: the worker says so (gunicorn's error), and its
    connection is closed after the answer, not left to wait for a request read out of step."""
    parser = _parsed(CHUNKED_GRAB + b"zz\r\nabc\r\n0\r\n\r\nGET /api/ping/ HTTP/1.1\r\n\r\n")
    with pytest.raises(http_errors.InvalidChunkSize):
        webworker.next_request_read(parser)


CHUNK_EXTENSIONS = [
    b"5;name\r\nhello\r\n",
    b"5;name=value \t\r\nhello\r\n",  # whitespace after the last, as gunicorn and nginx take it
    b"5 ; name = value ;q=1\r\nhello\r\n",
    b'5;name="a \\"quoted\\" value; with = signs"\r\nhello\r\n',
]


@pytest.mark.parametrize("chunk", CHUNK_EXTENSIONS)
def test_chunk_extensions_as_the_rfc_writes_them_are_passed_over(chunk: bytes) -> None:
    with _one_connection() as sock:
        sock.sendall(
            b"POST /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunk
            + b"0\r\n\r\nGET /nowhere/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        assert Answers(sock).until_closed() == [401, 404]


@pytest.mark.parametrize(
    "connection",
    [
        b"Connection: keep-alive, close\r\n",
        b"Connection: TE, close\r\nTE: trailers\r\n",
        b"Connection: keep-alive\r\nConnection: close\r\n",
        b"Connection: Close \r\n",
    ],
)
def test_close_among_the_connection_options_closes_the_connection(connection: bytes) -> None:
    """RFC 9110 7.6.1: Connection is a list. gunicorn read the first header's value whole,
    kept such a connection open and answered the request behind it."""
    with _one_connection() as sock:
        sock.sendall(
            b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + connection
            + b"\r\nGET /nowhere/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        answers = Answers(sock)
        status, headers, _ = answers.next()
        assert (status, headers["connection"]) == (401, "close")
        assert answers.until_closed() == []


def test_an_http_1_0_request_gets_no_100_continue():
    """HTTP/1.0 has no interim answers: the first line it reads is its answer's."""
    with _one_connection() as sock:
        sock.sendall(b"GET /api/ping/ HTTP/1.0\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 401 "), answer[:60]


@pytest.mark.parametrize("last_sent", [b"\r\n\r\n", b"\r\n\r"])  # a CRLF's CR, its LF to come
def test_empty_lines_before_a_request_line_are_passed_over(last_sent: bytes) -> None:
    """A body ended with an extra CRLF (RFC 9112 2.2: a server should ignore it), pipelined or
    sent with a later request: the requests after it are answered, not refused as 400."""
    grab = b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
    grab += b"\r\n{}"
    ping = b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    last = b"GET /nowhere/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with _one_connection() as sock:
        sock.sendall(grab + b"\r\n" + ping + last_sent)
        answers = Answers(sock)
        assert [answers.next_status(), answers.next_status()] == [401, 401]
        sock.sendall(b"\n" + last)  # the empty lines sent before came on their own
        assert answers.until_closed() == [404]


NOWHERE = b"GET /nowhere/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    ("with_first", "after_answer"),
    [
        (NOWHERE[:17], b""),  # pipelined: the next request's start read with the first
        (b"", b"\r\n"),  # an empty line alone
    ],
)
def test_the_start_of_a_next_request_waits_in_the_loop_not_in_a_thread(
    with_first: bytes, after_answer: bytes
) -> None:
    """On a kept-alive connection, the start of the next request (read with the one answered,
    or an empty line sent on its own) does not hold the worker's one thread until the request
    deadline (600 s here): another client is answered meanwhile, and the next request is
    answered once its rest has come."""
    with gunicorn(workers=1, threads=1, REDPACK_WEB_READ_TIMEOUT="600") as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as kept:
            kept.sendall(b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + with_first)
            answers = Answers(kept)
            assert answers.next_status() == 401
            kept.sendall(after_answer)
            status, _, _ = raw_request(
                base, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            assert status in (200, 503)
            kept.sendall(NOWHERE[len(with_first) :])
            assert answers.until_closed() == [404]


GRAB_HEAD = b"POST /api/activities/1/grab/ HTTP/1.1\r\nHost: x\r\n"
WAIT, READY, INVALID = webworker.Arrival.WAIT, webworker.Arrival.READY, webworker.Arrival.INVALID


@pytest.mark.parametrize(
    ("data", "verdict", "expect"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", READY, False),
        (b"\r\n\r\nGET / HTTP/1.1\r\n\r\n", READY, False),  # empty lines first
        (b"\r\n", WAIT, False),
        (b"\r\n" * 40, READY, False),  # more empty lines than a request may begin with
        (b"GET / HTTP/1.1\r", WAIT, False),  # its CRLF split between two reads
        (b"GET / HTTP/1.1\r\nHost: x\r\n", WAIT, False),
        (GRAB_HEAD + b"Content-Length: 5\r\n\r\nabc", WAIT, False),
        (GRAB_HEAD + b"Content-Length: 5\r\n\r\nabcde", READY, False),
        (GRAB_HEAD + b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n", WAIT, True),
        (
            GRAB_HEAD.replace(b"1.1", b"1.0")
            + b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n",
            WAIT,
            False,
        ),
        (GRAB_HEAD + b"Content-Length: 11\r\nExpect: 100-continue\r\n\r\n", READY, False),  # over
        (GRAB_HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n", READY, False),
        (GRAB_HEAD + b"Content-Length: -1\r\n\r\n", READY, False),
        (GRAB_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhel", WAIT, False),
        (GRAB_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", READY, False),
        (GRAB_HEAD + b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n", WAIT, True),
        (GRAB_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", READY, False),  # no size
        # A line is judged once it has ended, as gunicorn's parser judges it.
        (GRAB_HEAD + b"Transfer-Encoding: chunked\r\n\r\nz", WAIT, False),
        (GRAB_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nz", WAIT, False),
        (GRAB_HEAD + b"Transfer-Encoding: chunked\r\n\r\n10\r\n", READY, False),  # over 10
        (GRAB_HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhel", WAIT, False),
        (
            GRAB_HEAD + b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n",
            WAIT,
            False,
        ),
        (GRAB_HEAD + b"Transfer-Encoding: chunked, chunked\r\n\r\n", READY, False),
        (GRAB_HEAD + b"Transfer-Encoding: br, chunked\r\n\r\n", READY, False),  # gunicorn: 400
        (GRAB_HEAD.replace(b"1.1", b"1.0") + b"Transfer-Encoding: chunked\r\n\r\n", READY, False),
        (GRAB_HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", READY, False),
        (GRAB_HEAD + b"Transfer-Encoding: gzip\r\n\r\n", READY, False),
        (GRAB_HEAD + b"X-Folded: a\r\n b\r\nContent-Length: 5\r\n\r\n", READY, False),
        (b"GET / HTTP/1.1\nHost: x\n\n", INVALID, False),  # bare LF
        (b"GET / HTTP/1.1\r\nHost: x\n\n", INVALID, False),  # bare LF after the request line
        (b"GET / HTTP/1.1\r\nHost: x\r\n\n", INVALID, False),  # the empty line's
        (b"GET / HTTP/1.1\r\nHost: x\n\r\n", INVALID, False),  # the last header's
        (b"GET / HTTP/1.1\r\nHost: x\nX: y", WAIT, False),  # not ended yet
        (b"GET /\r\n", INVALID, False),  # HTTP/0.9: no head follows
        (b"\x16\x03\x01\x02\x00\x01\x00", INVALID, False),  # a TLS ClientHello
        (b"GET /\x00 HTTP/1.1\r\n\r\n", INVALID, False),
        (b"GET /" + b"a" * webworker.LINE_BYTES, INVALID, False),  # a request line too long
        (GRAB_HEAD + b"X: " + b"a" * webworker.HEAD_BYTES, INVALID, False),  # a head too long
        (GRAB_HEAD + b"X: " + b"a" * (webworker.HEAD_BYTES - 100) + b"\r\n\r\n", READY, False),
    ],
)
def test_the_loop_hands_a_request_over_once_it_has_come(
    data: bytes, verdict: str, expect: bool
) -> None:
    assert webworker.arrival(data, body_bytes=10)[:2] == (verdict, expect)


def test_a_head_ended_by_lf_alone_is_found_in_the_bytes_that_came_last() -> None:
    """The loop looks for such an end in the bytes of the last read and the two before them (a
    slow client's every byte would otherwise cost a search of its whole head): an end split
    between two reads is found; one in earlier bytes was found when they came."""
    data = b"GET / HTTP/1.1\r\nHost: x\n\r\n"
    assert webworker.arrival(data, body_bytes=10, fresh=1)[0] == INVALID
    assert webworker.arrival(data + b"X", body_bytes=10, fresh=1)[0] == WAIT


def test_pieces_of_a_body_do_not_parse_its_head_again() -> None:
    """Waiting for a body, the loop is told how long the request will be."""
    data = b"\r\n" + GRAB_HEAD + b"Content-Length: 5\r\n\r\nab"
    assert webworker.arrival(data, body_bytes=10) == (WAIT, False, len(data) + 3, None)


def test_a_chunked_body_sent_byte_by_byte_is_waited_for_to_its_last_byte() -> None:
    """The walk goes on from where it stopped: told how long the request must grow before a new
    look (past a chunk's data at once), it hands the request over at the empty line that ends
    the trailers, and not a byte before."""
    head = GRAB_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    data = head + b"5;a=b\r\nhello\r\n1A\r\n" + b"x" * 26 + b"\r\n0\r\nX-Sum: 1\r\n\r\n"
    verdict, _, complete_at, walk = webworker.arrival(data[: len(head)], body_bytes=100)
    assert (verdict, complete_at) == (WAIT, len(head) + 1) and walk is not None
    looks = []
    for end in range(len(head) + 1, len(data) + 1):
        if end >= complete_at:
            looks.append(end)
            complete_at = walk.to_come(data[:end])
            if not complete_at:
                break
    assert end == len(data)  # handed over with its last byte
    for chunk in (b"hello\r\n", b"x" * 26 + b"\r\n"):  # its data stepped over, not looked at
        start = data.index(chunk)
        assert not [end for end in looks if start < end < start + len(chunk)], looks
    assert looks[-1] == len(data)


@pytest.mark.parametrize(
    ("garbage", "field"),
    [
        (b"GET / HTTP/1.1\nHost: x\n\n", "request_line"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "request_line"),
        (b"GET /api/ping/\r\n", "request_line"),
        (b"GET /api/ping/ HTTP/1.1\r\nHost: x\n\n", "headers"),
    ],
)
def test_bytes_that_begin_no_request_are_refused_at_once(garbage: bytes, field: str) -> None:
    """A bare LF, a TLS ClientHello on the plain port, an HTTP/0.9 request line: no head of
    theirs would ever end (gthread held a thread on them until the request deadline, and closed
    without a word; the loop waited as long and answered 408); here a 400 naming what was wrong,
    and the end of the connection."""
    with gunicorn(workers=1, threads=1, REDPACK_WEB_READ_TIMEOUT="600") as base:
        status, headers, body = raw_request(base, garbage)
    assert (status, headers["connection"]) == (400, "close")
    assert list(json.loads(body)["error"]["fields"]) == [field]


def test_a_body_over_the_limit_gets_no_100_continue_and_its_413_is_not_reset():
    """The app refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE unread (413): a client that asked
    for 100 Continue gets the 413 instead, with Connection: close, and one that sends its body
    anyway is not reset by the close (the server stops writing and drops what still comes), so
    it reads its answer."""
    head = (
        b"POST /api/token/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10000000\r\nExpect: 100-continue\r\n\r\n"
    )
    with _one_connection() as sock:
        sock.sendall(head)
        answers = Answers(sock)
        first = sock.recv(12, socket.MSG_PEEK | socket.MSG_WAITALL)
        assert first == b"HTTP/1.1 413", first  # not "HTTP/1.1 100"
        sock.sendall(b" " * 2_000_000)  # past what the sockets' buffers hold: read, then dropped
        sock.shutdown(socket.SHUT_WR)
        status, headers, _ = answers.next()
        assert (status, headers["connection"]) == (413, "close")
        assert answers.read() == b""  # the end, not a reset


@pytest.mark.parametrize(
    ("behind", "version"),
    [
        (b"", b"1.1"),
        (b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"1.1"),
        (b"", b"1.2"),  # a later 1.x, answered as 1.1
    ],
)
def test_a_request_that_asks_for_100_continue_gets_one(behind: bytes, version: bytes) -> None:
    """The loop sends it (or the thread, for a request read with the one before it: pipelined),
    and the request goes to a thread once its body has come: one 100 Continue, then the
    answer."""
    body = b'{"username": "nobody", "password": "x"}'
    head = (
        b"POST /api/token/ HTTP/%s\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
        % (version, len(body))
    )
    with _one_connection() as sock:
        sock.sendall(behind + head)
        answers = Answers(sock)
        if behind:
            assert answers.next_status() == 401  # the ping's, without a token
        assert answers.reader.readline() + answers.reader.readline() == (
            b"HTTP/1.1 100 Continue\r\n\r\n"
        )
        sock.sendall(body)
        assert answers.until_closed() == [401]  # no such account


def test_the_loop_wakes_for_the_next_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection's deadline is kept on time, not up to the loop's one-second poll late."""
    worker = _loop_of_one_worker(monkeypatch, [])
    worker._listening = True
    monkeypatch.setattr(webworker, "clock", lambda: 100.0)
    assert worker._poll_seconds() == 1.0  # nothing waits
    waiting = _Waiting()
    worker._wait(waiting, 0.25)
    assert worker._poll_seconds() == 0.25
    monkeypatch.setattr(webworker, "clock", lambda: 101.0)
    assert worker._poll_seconds() == 0.0  # past: at once
    worker.poller.close()


class _Waiting:
    """A connection as the deadlines see it."""

    waits = 0


def test_a_deadline_holds_its_connection_weakly() -> None:
    """A connection closed before its deadline (most: their first bytes come long before
    FIRST_BYTE_TIMEOUT) is freed at once, not held until its entry's turn (a minute of a
    burst's connections); one still waiting is yielded at its deadline."""
    deadlines = webworker._Deadlines()
    gone, waiting = _Waiting(), _Waiting()
    deadlines.add(1.0, gone)
    deadlines.add(2.0, waiting)
    freed = weakref.ref(gone)
    del gone
    gc.collect()
    assert freed() is None
    assert list(deadlines.past(3.0)) == [waiting]


def test_the_accepted_connections_are_pruned_past_a_silent_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One silent connection at the head of `_accepted` (with no first-byte limit it may stay
    for ever) would keep the entries of every connection accepted after it: past twice the
    worker's connections, only the silent ones are kept."""
    worker = _loop_of_one_worker(monkeypatch, [])
    silent, moved_on = _Waiting(), [_Waiting() for _ in range(100)]
    worker._accepted.append((1.0, weakref.ref(silent), 0))
    for conn in moved_on:
        worker._accepted.append((2.0, weakref.ref(conn), 0))
        conn.waits = 1  # its request came
    worker.nr_conns = 1
    worker._forget_accepted()
    assert [ref() for _, ref, _ in worker._accepted] == [silent]
    worker.poller.close()


def _worker_on_a_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Any, list[Any], list[float], socket.socket]:
    """A worker's loop (`_loop_of_one_worker`) whose requests for a thread land in `handed`,
    whose deadlines read `now[0]`, and a listening socket of its own."""
    worker = _loop_of_one_worker(monkeypatch, [])
    handed: list[Any] = []
    monkeypatch.setattr(worker, "enqueue_req", handed.append)
    now = [100.0]
    monkeypatch.setattr(webworker, "clock", lambda: now[0])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    return worker, handed, now, listener


def test_a_deadline_counts_what_came_before_it_even_if_the_loop_had_not_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass of the loop that outlasts FIRST_BYTE_TIMEOUT ends with the deadlines of the
    connections it accepted at its start. One whose request is whole in its socket goes to a
    thread (it was closed unread, reset, its client never answered); one that sent nothing is
    closed; one with the start of a request gets the 408 READ_TIMEOUT after its bytes were
    read."""
    worker, handed, now, listener = _worker_on_a_clock(monkeypatch)
    whole, begun, silent = (
        socket.create_connection(listener.getsockname(), timeout=10) for _ in range(3)
    )
    try:
        wait_for(lambda: _waiting(listener) == 3, "the 3 connections in the listen queue")
        worker.accept(listener.getsockname(), listener)
        assert worker.nr_conns == 3
        whole.sendall(b"GET /api/ping/ HTTP/1.1\r\nHost: redpack\r\n\r\n")
        begun.sendall(b"GET /api/ping/ HTTP/1.1\r\nHost: red")
        accepted = {conn.sock.getpeername(): conn for conn in worker._unread}
        for client in (whole, begun):
            server_side = accepted[client.getsockname()].sock
            wait_for(lambda s=server_side: webworker._request_waiting(s), "the bytes sent")
        assert webworker.FIRST_BYTE_TIMEOUT is not None
        now[0] += webworker.FIRST_BYTE_TIMEOUT + 1  # no poll in between: nothing read yet
        worker._expire_waits()

        assert [conn.sock.getpeername() for conn in handed] == [whole.getsockname()]
        assert handed[0].early == b"GET /api/ping/ HTTP/1.1\r\nHost: redpack\r\n\r\n"
        assert read_until_closed(silent) == b""
        assert worker.nr_conns == 2  # the whole one's, and the begun one's

        assert webworker.READ_TIMEOUT is not None
        now[0] += webworker.READ_TIMEOUT + 1  # the begun one's, from its first bytes read
        worker._expire_waits()
        assert read_until_closed(begun).startswith(b"HTTP/1.1 408 ")
        assert worker.nr_conns == 2  # the whole one's, and the lingering 408
    finally:
        for conn in handed:
            conn.sock.close()
        _close_all(worker, whole, begun, silent, listener)


def test_a_connection_whose_request_comes_past_the_read_deadline_is_still_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel hands a connection over without its request once the handshake has waited
    `defer_accept`'s period, and its client's TCP may then take as long again to resend the
    request (a hot burst's full listen queue dropped it each time). Closed at READ_TIMEOUT from
    its accept, it was reset when the request came, unanswered (1,201 of a burst of 10,000):
    its request, READ_TIMEOUT and more later, goes to a thread."""
    worker, handed, now, listener = _worker_on_a_clock(monkeypatch)
    late = socket.create_connection(listener.getsockname(), timeout=10)
    try:
        wait_for(lambda: _waiting(listener) == 1, "the connection in the listen queue")
        worker.accept(listener.getsockname(), listener)
        assert webworker.READ_TIMEOUT is not None
        now[0] += webworker.READ_TIMEOUT + 1
        worker._expire_waits()
        assert worker.nr_conns == 1 and not handed  # still waiting for its first byte

        late.sendall(b"GET /api/ping/ HTTP/1.1\r\nHost: redpack\r\n\r\n")
        (conn,) = worker._unread
        wait_for(lambda: webworker._request_waiting(conn.sock), "the request sent")
        for key, _ in worker.poller.select(10):
            key.data(key.fileobj)
        assert [c.early for c in handed] == [b"GET /api/ping/ HTTP/1.1\r\nHost: redpack\r\n\r\n"]
    finally:
        for conn in handed:
            conn.sock.close()
        _close_all(worker, late, listener)


def test_dropping_a_socket_a_thread_closed_does_not_search_the_poller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gunicorn closes a connection whose answer failed midway in its thread; the worker then
    drops it. The selector would look for a closed socket through its whole map, which the loop
    changes without the worker's lock (a 'dictionary changed size' error there left the
    connection counted for ever). A socket a thread held is in no poller: it is not asked."""
    worker = _loop_of_one_worker(monkeypatch, [])
    server, client = socket.socketpair()
    conn = SimpleNamespace(sock=server, waits=0, close=server.close)
    worker.nr_conns = 1
    server.close()

    def searched(fileobj: Any) -> NoReturn:
        raise AssertionError(f"asked to unregister {fileobj}")

    monkeypatch.setattr(worker.poller, "unregister", searched)
    try:
        worker._drop(conn)
        assert worker.nr_conns == 0 and conn.waits == 1
    finally:
        client.close()
        worker.poller.close()


def _kept_alive(worker: Any) -> tuple[socket.socket, socket.socket]:
    """A connection `worker` keeps alive, idle, its keep-alive long to run: (server's end,
    client's end)."""
    server_side, client_side = socket.socketpair()
    conn = webworker._Conn(worker.cfg, server_side, ("127.0.0.1", 0), ("127.0.0.1", 0))
    conn.initialized = True
    conn.timeout = time.time() + 600
    worker._keep.append(conn)
    worker.poller.register(server_side, selectors.EVENT_READ)
    worker.nr_conns += 1
    return server_side, client_side


@pytest.mark.parametrize("pieces", [[b"\r\n"], [b"\r", b"\n"]])
def test_empty_lines_on_a_kept_alive_connection_keep_it_alive(
    monkeypatch: pytest.MonkeyPatch, pieces: list[bytes]
) -> None:
    """A CRLF a client sends after an answer (RFC 9112 2.2: passed over), whole or its CR and
    its LF read apart, leaves the connection kept alive: not closed unanswered READ_TIMEOUT
    later (a pooled client's next request met a closed connection), and the request that
    follows, long after, goes to a thread."""
    worker, handed, now, listener = _worker_on_a_clock(monkeypatch)
    server_side, client_side = _kept_alive(worker)
    (conn,) = worker._keep
    try:
        for piece in pieces:
            client_side.sendall(piece)
            wait_for(lambda: webworker._request_waiting(server_side), "the empty line sent")
            worker.on_client_socket_readable(conn, server_side)
            assert list(worker._keep) == [conn]

        assert webworker.READ_TIMEOUT is not None
        now[0] += webworker.READ_TIMEOUT + 1
        worker._expire_waits()
        assert list(worker._keep) == [conn] and worker.nr_conns == 1
        assert server_side.fileno() != -1 and not handed

        client_side.sendall(b"GET /api/ping/ HTTP/1.1\r\nHost: redpack\r\n\r\n")
        wait_for(lambda: webworker._request_waiting(server_side), "the request sent")
        worker.on_client_socket_readable(conn, server_side)
        assert [c.early for c in handed] == [
            b"\r\nGET /api/ping/ HTTP/1.1\r\nHost: redpack\r\n\r\n"
        ]
        assert list(worker._keep) == []
    finally:
        for handed_conn in handed:
            handed_conn.sock.close()
        _close_all(worker, client_side, listener)


def test_a_full_worker_closes_its_longest_idle_kept_alive_connections_for_those_that_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a long keep-alive, a burst's answered clients fill a worker; a worker that holds
    `worker_connections` while connections wait in the listen queue closes its longest idle
    kept-alive ones (EVICT_BATCH per pass at most) and accepts the waiting one. Nobody waiting,
    or room left: nothing is closed."""
    worker = _loop_of_one_worker(monkeypatch, [])
    monkeypatch.setattr(webworker, "EVICT_BATCH", 2)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    worker.sockets = [listener]
    pairs = [_kept_alive(worker) for _ in range(3)]
    worker.worker_connections = 3
    waiting: socket.socket | None = None
    try:
        worker._make_room()  # full, but nobody waits
        assert worker.nr_conns == 3 and len(worker._keep) == 3

        waiting = socket.create_connection(listener.getsockname(), timeout=10)
        waiting.sendall(b"GET /api/ping/ HTTP/1.1\r\nHost: redpack\r\n\r\n")
        wait_for(lambda: _waiting(listener) == 1, "the connection in the listen queue")
        worker._make_room()
        assert worker.nr_conns == 1 and len(worker._keep) == 1
        assert [pair[0].fileno() == -1 for pair in pairs] == [True, True, False]  # oldest first
        pairs[0][1].settimeout(10)
        assert pairs[0][1].recv(1) == b""  # the client sees the close
        assert worker._room()
        worker.accept(listener.getsockname(), listener)
        assert worker.nr_conns == 2

        worker._make_room()  # room left: nothing closed
        assert len(worker._keep) == 1
    finally:
        _close_all(worker, *(end for pair in pairs for end in pair), waiting, listener)


def _one_more_waits(listener: socket.socket) -> socket.socket:
    client = socket.create_connection(listener.getsockname(), timeout=10)
    wait_for(lambda: _waiting(listener) == 1, "the connection in the listen queue")
    return client


def test_a_full_worker_closes_connections_silent_for_half_the_first_byte_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection that sends nothing holds its place for FIRST_BYTE_TIMEOUT: a worker full of
    them, with none kept alive to close, closes those silent for SILENT_EVICT_SECONDS since
    their accept, the oldest first, for one waiting in the listen queue. One whose request came
    meanwhile goes to a thread instead; a younger one stays until it is as old."""
    worker, handed, now, listener = _worker_on_a_clock(monkeypatch)
    worker.sockets, worker.worker_connections = [listener], 3
    came = socket.create_connection(listener.getsockname(), timeout=10)
    oldest = socket.create_connection(listener.getsockname(), timeout=10)
    young = waiting = later = None
    try:
        wait_for(lambda: _waiting(listener) == 2, "the 2 connections in the listen queue")
        worker.accept(listener.getsockname(), listener)
        now[0] += webworker.SILENT_EVICT_SECONDS
        young = _one_more_waits(listener)
        worker.accept(listener.getsockname(), listener)
        assert worker.nr_conns == 3
        came.sendall(b"GET /api/ping/ HTTP/1.1\r\nHost: redpack\r\n\r\n")
        by_peer = {conn.sock.getpeername(): conn for conn in worker._unread}
        wait_for(
            lambda: webworker._request_waiting(by_peer[came.getsockname()].sock), "the request"
        )

        worker._make_room()  # full, but nobody waits
        assert worker.nr_conns == 3 and not handed

        waiting = _one_more_waits(listener)
        worker._make_room()  # room for one: the oldest two go, the young one stays
        assert [conn.sock.getpeername() for conn in handed] == [came.getsockname()]
        assert read_until_closed(oldest) == b""
        assert worker.nr_conns == 2  # the request in a thread's hands, the young one
        worker.accept(listener.getsockname(), listener)

        later = _one_more_waits(listener)
        worker._make_room()  # full, one waits, and the young one is not silent for as long yet
        assert worker.nr_conns == 3
        assert by_peer[young.getsockname()].sock.fileno() != -1
        now[0] += webworker.SILENT_EVICT_SECONDS
        worker._make_room()  # now it is, and so is the one accepted after it
        assert read_until_closed(young) == b"" and read_until_closed(waiting) == b""
        assert worker.nr_conns == 1  # the request in a thread's hands
    finally:
        for conn in handed:
            conn.sock.close()
        _close_all(worker, came, oldest, young, waiting, later, listener)


def test_a_full_worker_closes_silent_connections_only_while_it_is_full_and_within_its_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kept-alive connections go first, and the silent ones only if the worker is still
    full: EVICT_BATCH in all per pass of the loop."""
    worker, _, now, listener = _worker_on_a_clock(monkeypatch)
    monkeypatch.setattr(webworker, "EVICT_BATCH", 2)
    worker.sockets = [listener]
    silent = [socket.create_connection(listener.getsockname(), timeout=10) for _ in range(2)]
    kept = [_kept_alive(worker)]
    waiting = None
    try:
        wait_for(lambda: _waiting(listener) == 2, "the 2 connections in the listen queue")
        worker.accept(listener.getsockname(), listener)
        now[0] += webworker.SILENT_EVICT_SECONDS
        waiting = _one_more_waits(listener)

        worker.worker_connections = 3
        worker._make_room()  # the kept-alive one makes room: the silent ones stay
        assert worker.nr_conns == 2 and not worker._keep
        assert len(worker._accepted) == 2

        kept.append(_kept_alive(worker))
        worker.worker_connections = 1  # full, two over, after the kept-alive one
        worker._make_room()  # one kept-alive and one silent, the oldest: the batch of 2
        assert worker.nr_conns == 1 and not worker._keep
        assert read_until_closed(silent[0]) == b""
        assert len(worker._accepted) == 1
    finally:
        _close_all(worker, *silent, *(end for pair in kept for end in pair), waiting, listener)


def test_a_refused_request_is_logged_at_info_and_cut_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """gunicorn logs each request it refuses as a WARNING quoting the client's bytes: a client
    sending malformed heads wrote a line of up to 8 KB per request into the error log. A worker
    logs it at INFO (silent at gunicorn's `--log-level warning`), cut to QUOTED_AT_MOST
    characters."""
    worker = webworker.BalancedThreadWorker(
        9999, 0, [], None, 30, Config(), logging.getLogger("gunicorn.error")
    )
    server_side, client_side = socket.socketpair()
    try:
        refused = http_errors.InvalidRequestLine("GET /" + "x" * 5000)
        with caplog.at_level(logging.WARNING, logger="gunicorn.error"):
            worker.handle_error(None, server_side, ("192.0.2.1", 1), refused)
        assert not [r for r in caplog.records if r.name == "gunicorn.error"]
        with caplog.at_level(logging.INFO, logger="gunicorn.error"):
            worker.handle_error(None, server_side, ("192.0.2.1", 1), refused)
        (record,) = [r for r in caplog.records if r.name == "gunicorn.error"]
        assert record.levelno == logging.INFO
        assert record.getMessage().startswith("Invalid request from ip=192.0.2.1: ")
        message = record.getMessage()
        assert len(message) == logs.QUOTED_AT_MOST and message.endswith("…")
        client_side.settimeout(10)
        assert client_side.recv(12) == b"HTTP/1.1 400"  # answered as before
    finally:
        webworker.release(worker.slot)
        worker.tmp.close()
        server_side.close()
        client_side.close()


def test_an_answer_its_client_did_not_read_is_one_line_at_info() -> None:
    """gthread logs an answer it could not write within the socket's timeout (a client that
    does not read) as an ERROR with a traceback: the client's doing, one line at INFO. Other
    socket errors stay as they are."""
    refusals = webworker.ClientRefusals()

    def record(error: BaseException) -> logging.LogRecord:
        try:
            raise error
        except OSError:
            exc_info = sys.exc_info()
        return logging.LogRecord(
            "gunicorn.error", logging.ERROR, __file__, 1, refusals.UNREAD, (), exc_info
        )

    unread = record(TimeoutError("timed out"))
    logger = logging.getLogger("gunicorn.error")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        assert refusals.filter(unread)
    finally:
        logger.setLevel(level)
    assert (unread.levelno, unread.exc_info) == (logging.INFO, None)
    assert unread.getMessage().startswith("a client did not read its answer within ")
    other = record(OSError(errno.EBADF, "bad file descriptor"))
    assert refusals.filter(other) and other.levelno == logging.ERROR and other.exc_info
