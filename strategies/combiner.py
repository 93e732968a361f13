"""Flat combining: concurrent grabs of one activity in one process join a batch, run by one of
them, so that N waiting grabs cost one round trip (one Redis script, one MySQL transaction).

Per key (a strategy's activity), a FIFO of pending items that exists while a batch runs. A
caller that finds no batch running leads at once: its own item first, then the oldest pending
ones up to `cap` in all, run with `run_batch` on its own connections; it hands every member its
answer, passes the lead to the oldest item still pending (taking it off the line), and returns
its own answer. Any other caller appends its item and waits on its own gate for its answer, or
for the lead. So:

- never a timer: a lone grab runs at once, as a batch of one; batches grow only with contention
  (the items that arrived while the previous batch ran, or during its leader's pauses), up to
  `cap`;
- a caller handed the lead (so there is contention) first lets the threads already running
  reach the line: it gives up the interpreter (`pause`, time.sleep(0)) once, then again only
  while the line grew since the last pause, short of the cap, at most `gather` times, and then
  takes the batch. No deadline or timeout: a thread that has the CPU to itself comes straight
  back. Under load the batches are larger (about 11 against 10 on two cores, 64 connections)
  and each grab pays a smaller share of its batch's round trips (docs/benchmarks.md);
- a caller waits for at most the batch running when it arrived and its own;
- keys are independent: no caller waits on another activity's batch;
- followers touch no database connection while they wait (Django's are per thread);
- a follower may give up (`timeout`) only while its item is still pending: it is removed under
  the lock; once a batch has taken the item, the caller waits for its answer.

`run_batch(key, items)` returns one answer per item, in order; an answer that is an exception is
raised in that member's thread. If `run_batch` itself raises, every member of the batch raises
that exception and the next pending caller leads the next batch.

Batch sizes are counted per process (`batch_sizes()`), for the lab's histogram, and in
redpack_batch_size for /metrics.
"""

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from redpack import metrics

Item = TypeVar("Item")
Answer = TypeVar("Answer")


class GaveUp(Exception):
    """The caller's timeout passed while its item was still waiting for a batch."""


def _closed_gate() -> threading.Lock:
    gate = threading.Lock()
    gate.acquire()
    return gate


class _Slot(Generic[Item, Answer]):
    """A waiting caller's item. Its gate is a lock taken at creation: the caller waits by
    taking it again, a leader wakes it by releasing it (cheaper than an Event), once for the
    lead or once for the answer. A caller that leads at once has no slot."""

    __slots__ = ("item", "gate", "taken", "lead", "answered", "answer")

    def __init__(self, item: Item, gate: threading.Lock) -> None:
        self.item = item
        self.gate = gate
        self.taken = False  # a batch holds it: the caller waits for the answer, whatever happens
        self.lead = False  # woken to lead the next batch (off the line, not in a batch)
        self.answered = False
        self.answer: Answer | BaseException | None = None


class _Lane(Generic[Item, Answer]):
    """An activity's queue; it exists while a batch runs (then a caller leads), else not."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: deque[_Slot[Item, Answer]] = deque()


_sizes_lock = threading.Lock()
_sizes: Counter[int] = Counter()


def batch_sizes() -> Counter[int]:
    """Batch size -> batches run, in this process since start (or the last reset)."""
    with _sizes_lock:
        return Counter(_sizes)


def reset_batch_sizes() -> None:
    with _sizes_lock:
        _sizes.clear()


class Combiner(Generic[Item, Answer]):
    def __init__(
        self,
        run_batch: Callable[[Hashable, list[Item]], Sequence["Answer | BaseException"]],
        *,
        cap: Callable[[], int],
        gather: Callable[[], int] = lambda: 0,
        pause: Callable[[], object] = lambda: time.sleep(0),
    ) -> None:
        self.run_batch = run_batch
        self.cap = cap  # read per batch, so that settings changes apply at once
        self.gather = gather  # pauses at most before a handed-over batch (0: none), per batch
        self.pause = pause
        self._lock = threading.Lock()
        self._lanes: dict[Hashable, _Lane[Item, Answer]] = {}

    def pending(self, key: Hashable) -> int:
        """Items of `key` waiting for a batch (not those a running batch holds)."""
        with self._lock:
            lane = self._lanes.get(key)
            return len(lane.pending) if lane else 0

    def submit(self, key: Hashable, item: Item, *, timeout: float | None = None) -> Answer:
        """Run `item` in a batch of `key`'s items and return its answer (or raise its error).

        GaveUp when `timeout` seconds passed and no batch had taken the item yet.
        """
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:  # no batch runs: this caller leads one at once, with no slot
                self._lanes[key] = lane = _Lane()
                slot: _Slot[Item, Answer] | None = None
            else:
                slot = _Slot(item, _closed_gate())
                lane.pending.append(slot)
        if slot is None:
            return self._lead(key, lane, item, handed=False)
        if not slot.gate.acquire(timeout=-1 if timeout is None else timeout):
            with self._lock:
                if not slot.taken and not slot.lead:
                    lane.pending.remove(slot)
                    raise GaveUp(f"no batch took the item within {timeout} s")
            slot.gate.acquire()  # taken meanwhile: its answer (or the lead) is on the way
        if slot.answered:
            return self._unwrapped(slot.answer)
        assert slot.lead  # the lead was passed to it, its slot off the lane
        return self._lead(key, lane, item, handed=True)

    def _lead(self, key: Hashable, lane: _Lane[Item, Answer], own: Item, *, handed: bool) -> Answer:
        """Run one batch: the leader's own item, then the oldest pending ones up to the cap;
        answer its members, pass the lead on (or retire the lane when nobody waits), and return
        the leader's own answer. `handed`: the lead was passed on by a batch (`_gather` first)."""
        others: list[_Slot[Item, Answer]] = []
        try:  # whatever fails from here on, the lead moves on and no member waits forever
            if handed:
                self._gather(lane)
            with self._lock:
                pending = lane.pending
                others = [pending.popleft() for _ in range(min(self.cap() - 1, len(pending)))]
                for member in others:
                    member.taken = True
            size = 1 + len(others)
            with _sizes_lock:
                _sizes[size] += 1
            metrics.BATCH_SIZE.observe(size)
            answers: Sequence[Answer | BaseException] = self.run_batch(
                key, [own, *(member.item for member in others)]
            )
            if len(answers) != size:
                raise RuntimeError(f"{len(answers)} answers for a batch of {size}")
        except BaseException as exc:  # noqa: BLE001 - every member gets it, the lead moves on
            answers = [exc] * (1 + len(others))
        finally:
            with self._lock:
                if lane.pending:
                    successor = lane.pending.popleft()
                    successor.lead = True
                    successor.gate.release()
                else:
                    del self._lanes[key]
        for member, answer in zip(others, answers[1:], strict=True):
            member.answer = answer
            member.answered = True
            member.gate.release()
        return self._unwrapped(answers[0])

    def _gather(self, lane: _Lane[Item, Answer]) -> None:
        """Pause once, then again while the line grew since the last pause (callers arriving),
        short of a full batch, at most `gather` times. The line's length is read without the
        lock: a hint, the batch is taken under it."""
        full = self.cap() - 1
        seen = -1
        for _ in range(self.gather()):
            waiting = len(lane.pending)
            if waiting <= seen or waiting >= full:
                return
            seen = waiting
            self.pause()

    @staticmethod
    def _unwrapped(answer: "Answer | BaseException | None") -> Answer:
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]
