"""gunicorn's threaded worker (gthread) with the two changes a hot burst needs.

A hot burst opens thousands of connections within a millisecond. With gunicorn's own gthread
worker, two things made it slow and its end late:

- **Uneven workers.** Every worker polls the one listening socket and accepts whatever is there
  whenever its main thread runs; a connection stays with the worker that accepted it. In a
  burst one worker often took 70% of the connections (measured: 6,623 against 2,702), answered
  them alone while the other sat idle, and the burst ended when the busier one did. Here each
  worker publishes how many requests it holds (accepted or read, not yet answered) in memory
  shared by the server's workers, and polls the listening socket only while it holds no more
  than the least busy worker plus `ACCEPT_SLACK`: the rest of the burst waits in the kernel's
  listen queue for the other worker (`may_accept`). The least busy worker always accepts, so
  no connection waits for a worker that will not take it.
- **A loop that costs more the more it holds.** gthread's main loop asked every pending request
  whether it had finished (`futures.wait` over all of them, a lock each) on every pass: with
  thousands of requests waiting for a thread, each pass cost milliseconds of the interpreter
  lock that the request threads needed. Here a finished request removes itself.

Everything else (keep-alive, timeouts, graceful shutdown) is gthread's. gunicorn.conf.py makes
this the worker class of every redpack web server.
"""

import ctypes
import errno
import os
import selectors
import threading
from concurrent import futures
from functools import partial
from multiprocessing.sharedctypes import RawArray, RawValue
from typing import Any

from gunicorn.workers.gthread import TConn, ThreadWorker

SLOTS = 256  # workers of one server at once, at most (gunicorn's default is 1)
# How many more requests than the least busy worker a worker may hold and still accept: a
# thread pool's worth (2 × 32 here), so that kept-alive traffic, which opens few connections,
# never waits on this rule, and a burst is split within that much.
ACCEPT_SLACK = int(os.environ.get("REDPACK_WEB_ACCEPT_SLACK", "32"))
IDLE_POLL_SECONDS = 0.01  # how soon a worker that stopped accepting looks at the others again

# Created when gunicorn imports the worker class, in its master, so that every worker it forks
# shares it: per slot, the worker's pid (0: free) and the requests it holds; and how many
# slots are in use at most (the worker count, until workers have been replaced many times).
_pids = RawArray(ctypes.c_long, SLOTS)
_held = RawArray(ctypes.c_long, SLOTS)
_used = RawValue(ctypes.c_long, 0)


def may_accept(own: int, others: list[int], slack: int) -> bool:
    """Whether a worker holding `own` requests polls the listening socket, while the other
    live workers hold `others`."""
    return not others or own <= min(others) + slack


def forget(pid: int) -> None:
    """The worker `pid` is gone (gunicorn.conf.py's child_exit, in the master): its slot is
    free, and it no longer counts as the least busy."""
    for slot in range(_used.value):
        if _pids[slot] == pid:
            _held[slot] = 0
            _pids[slot] = 0


def _claim(pid: int, first: int = 0) -> int:
    """A free slot for the worker `pid`, looked for from `first` on: the master numbers the
    workers it forks (their age), so workers that start together look in different slots."""
    for slot in (s % SLOTS for s in range(first, first + SLOTS)):
        if _pids[slot] in (0, pid):
            _pids[slot] = pid
            _held[slot] = 0
            _used.value = max(_used.value, slot + 1)
            return slot
    return -1  # more workers than slots: this one accepts as gthread does


class BalancedThreadWorker(ThreadWorker):  # type: ignore[misc]
    def init_process(self) -> None:
        self.slot = _claim(os.getpid(), self.age)
        self.held = 0
        self._held_lock = threading.Lock()
        self._pending: set[futures.Future[Any]] = set()
        self._listening = False
        super().init_process()

    # --- what this worker holds ----------------------------------------------------------

    def _hold(self, change: int) -> None:
        with self._held_lock:
            self.held += change
            if self.slot >= 0:
                _held[self.slot] = self.held

    def _others(self) -> list[int]:
        me = self.slot
        return [_held[s] for s in range(_used.value) if s != me and _pids[s] != 0]

    def accept(self, server: Any, listener: Any) -> None:
        try:
            sock, client = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return  # another worker took it
        conn = TConn(self.cfg, sock, client, server)
        self.nr_conns += 1
        self._hold(1)
        with self._lock:
            self.poller.register(
                conn.sock, selectors.EVENT_READ, partial(self.on_client_socket_readable, conn)
            )

    def on_client_socket_readable(self, conn: Any, client: Any) -> None:
        with self._lock:
            self.poller.unregister(client)
            if conn.initialized:  # a kept-alive connection's next request
                try:
                    self._keep.remove(conn)
                except ValueError:  # its keep-alive ran out meanwhile: it is being closed
                    return
                self._hold(1)
        self.enqueue_req(conn)

    def _wrap_future(self, fs: futures.Future[Any], conn: Any) -> None:
        fs.conn = conn  # type: ignore[attr-defined]
        with self._held_lock:
            self._pending.add(fs)
        fs.add_done_callback(self.finish_request)

    def finish_request(self, fs: futures.Future[Any]) -> None:
        with self._held_lock:
            self._pending.discard(fs)
        try:
            super().finish_request(fs)
        finally:
            self._hold(-1)

    # --- the loop ------------------------------------------------------------------------

    def _listen(self, wanted: bool) -> None:
        if wanted == self._listening:
            return
        with self._lock:
            for sock in self.sockets:
                if wanted:
                    self.poller.register(
                        sock, selectors.EVENT_READ, partial(self.accept, sock.getsockname())
                    )
                else:
                    self.poller.unregister(sock)
        self._listening = wanted

    def run(self) -> None:
        for sock in self.sockets:
            sock.setblocking(False)
        while self.alive:
            self.notify()
            room = self.nr_conns < self.worker_connections
            self._listen(room and may_accept(self.held, self._others(), ACCEPT_SLACK))
            events = self.poller.select(1.0 if self._listening else IDLE_POLL_SECONDS)
            for key, _ in events:
                key.data(key.fileobj)
            if not self.is_parent_alive():
                break
            self.murder_keepalived()
        self.tpool.shutdown(False)
        self.poller.close()
        for sock in self.sockets:
            sock.close()
        with self._held_lock:
            pending = list(self._pending)
        futures.wait(pending, timeout=self.cfg.graceful_timeout)
