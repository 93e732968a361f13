"""How long grabs hold an activity row's lock, per process: from the statement that took it to
the COMMIT or ROLLBACK that released it, by this process's clock. The lab reads it
(redpack/lab/bench_worker.py): one hot row takes at most 10⁶ / (µs held per grab) grabs a second,
whatever the client side costs. It is an upper bound: a thread wakes some time after each reply
(later under load, when many threads share the interpreter), and the server does not wait for
that after the COMMIT.

`steps.grab_transaction` calls `began()` at its start and `released()` at its end; inside it,
`steps.read_for_grab` (locking), `steps.read_for_batch`, `steps.take_from_surplus` and the
decrement of `GrabTransaction.commit_with_grabs` call `taken()` as they return, the first call
starting the clock. Outside a grab transaction (the persister's own) nothing is counted. Two
clock reads and one short lock per transaction.
"""

import threading
import time
from dataclasses import dataclass

_open = threading.local()
_lock = threading.Lock()


@dataclass
class Holds:
    transactions: int = 0
    seconds: float = 0.0
    longest: float = 0.0


_holds = Holds()


def began() -> None:
    """This thread opened a grab transaction."""
    _open.active, _open.since = True, None


def taken() -> None:
    """This thread's grab transaction now holds the row (a no-op once it does)."""
    if getattr(_open, "active", False) and _open.since is None:
        _open.since = time.monotonic()


def released() -> None:
    """This thread's grab transaction ended: its hold, if it took the row, is counted."""
    since = getattr(_open, "since", None)
    _open.active, _open.since = False, None
    if since is None:
        return
    held = time.monotonic() - since
    with _lock:
        _holds.transactions += 1
        _holds.seconds += held
        _holds.longest = max(_holds.longest, held)


def holds() -> Holds:
    """Transactions that held a row, in this process since start (or the last reset)."""
    with _lock:
        return Holds(_holds.transactions, _holds.seconds, _holds.longest)


def reset_holds() -> None:
    global _holds
    with _lock:
        _holds = Holds()
