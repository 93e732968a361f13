"""Load shedding: a bounded waiting line per activity in each process.

A grab request that finds its strategy's line (the setting GrabStrategy.line_setting names) of
grabs of the same activity already under way in its web process is answered at once
`contended` (409, reason `shed`, with Retry-After) instead of queueing behind them: on a hot
activity those grabs wait on one row lock or one batch, and a request stuck behind them holds
a web thread (and, for the MySQL strategies, a connection) that the fast answers of every other
request need. Other activities are never shed by this one's line.

A batch (strategies/combiner.py) counts as the grabs in it, so the bound must leave room for
a full one: the default (REDPACK_GRAB_LINE) is 2 × REDPACK_BATCH_MAX, above the web threads
of a process as `make run` starts it (32), so that only a server run with more threads than
that ever sheds (`optimistic`'s own line is 1). See docs/operations.md for the measurement
behind it.
"""

import threading

_lock = threading.Lock()
_in_line: dict[int, int] = {}  # activity id -> grabs under way in this process


class place:  # noqa: N801 - used as a function, like transaction.atomic
    """A place in the activity's line for the duration of the block; the block gets False (and
    no place) when the line is full and `bounded` (a web request: the direct bench and the
    tests' own threads drive the service unbounded, but still count in the line). A class, not
    a generator: it is on every grab's path."""

    __slots__ = ("activity_id", "bounded", "line", "placed")

    def __init__(self, activity_id: int, *, line: int, bounded: bool = True) -> None:
        self.activity_id = activity_id
        self.bounded = bounded
        self.line = line

    def __enter__(self) -> bool:
        with _lock:
            waiting = _in_line.get(self.activity_id, 0)
            self.placed = not (self.bounded and waiting >= self.line)
            if self.placed:
                _in_line[self.activity_id] = waiting + 1
        return self.placed

    def __exit__(self, *exc_info: object) -> None:
        if self.placed:
            with _lock:
                left = _in_line[self.activity_id] - 1
                if left:
                    _in_line[self.activity_id] = left
                else:
                    del _in_line[self.activity_id]
