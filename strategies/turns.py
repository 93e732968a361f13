"""One transaction at a time per activity in this process, for the seeds' one-grab strategies
whose transaction holds the activity's row lock (`grab_transaction(turn=activity_id)`), and
one waiter per process for distributed_lock's Redis lock.

InnoDB hands an activity's row lock to one transaction at a time. When every thread of a
process sends its transaction at once, the holder needs the GIL back after each statement and
finds it busy with the others' statements: the lock is held longer the more threads the process
has, and everything behind it waits longer (measured in docs/benchmarks.md, "A turn per
process"). Waiting for the turn here instead keeps the other threads asleep on a Python lock,
so the holder runs as soon as its reply arrives. The row is never idle for it: every other
process (web worker, bench process) keeps a transaction of its own waiting on the row.

Keys are independent: a grab never waits on another activity's turn. A turn is reentrant (a
thread that holds it may open another transaction of the same activity inside). A wait longer
than the turn's `wait` (WAIT_SECONDS unless given) raises NoTurn, an OperationalError with
MySQL's lock wait timeout code (1205), before any statement was sent: callers that know
nothing was sent answer at once, the others handle it as they handle InnoDB's own timeout.
"""

import threading
from collections.abc import Hashable
from types import TracebackType

from django.db import OperationalError

from redpack import dberrors

from .base import AnsweredMeanwhile, known_answer

WAIT_SECONDS = 50.0  # InnoDB's default innodb_lock_wait_timeout: the wait this one stands for


class NoTurn(OperationalError):
    """The turn was not had within its wait: nothing was sent to MySQL."""


_guard = threading.Lock()
_turns: dict[Hashable, "_Turn"] = {}


class _Turn:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.users = 0  # holding or waiting; the entry goes when none is left


class turn:  # noqa: N801 - used as a function, like transaction.atomic
    """Hold `key`'s turn in this process for the block (a class: it is on every grab's path).

    `ask_known`: the caller has written nothing and holds no lock for this grab; if it had to
    wait, the answer the service knows now for `key` (base.known_answer: the activity ended
    meanwhile) is raised as AnsweredMeanwhile instead of entering the block."""

    __slots__ = ("key", "wait", "ask_known", "entry")

    def __init__(
        self, key: Hashable, *, wait: float | None = None, ask_known: bool = False
    ) -> None:
        self.key = key
        self.wait = wait
        self.ask_known = ask_known

    def __enter__(self) -> None:
        with _guard:
            entry = _turns.get(self.key)
            if entry is None:
                entry = _turns[self.key] = _Turn()
            entry.users += 1
        acquired = False
        try:
            acquired = entry.lock.acquire(blocking=False)
            waited = not acquired
            if waited:
                wait = WAIT_SECONDS if self.wait is None else self.wait
                acquired = entry.lock.acquire(timeout=wait)
            if not acquired:
                raise NoTurn(dberrors.LOCK_WAIT_TIMEOUT, f"no turn for {self.key} in this process")
            if waited and self.ask_known:
                asked = known_answer.get()
                known = asked[1]() if asked is not None and asked[0] == self.key else None
                if known is not None:
                    raise AnsweredMeanwhile(known)
            self.entry = entry
        except BaseException:  # the timeout, the answer, an interrupt: leave no trace
            if acquired:
                entry.lock.release()
            self._leave(entry)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.entry.lock.release()
        self._leave(self.entry)

    def _leave(self, entry: _Turn) -> None:
        with _guard:
            entry.users -= 1
            if not entry.users:
                del _turns[self.key]


def waiting() -> int:
    """Threads of this process holding or waiting for a turn, over every key (for tests)."""
    with _guard:
        return sum(entry.users for entry in _turns.values())
