"""The combiner on its own (strategies/combiner.py): batches, cap, hand-over, a failing leader,
giving up, independent keys. Threads only; no database."""

import threading
import time
from collections.abc import Hashable, Sequence

import pytest

from strategies import combiner as combiner_module
from strategies.combiner import Combiner, GaveUp, batch_sizes, reset_batch_sizes


class Recorder:
    """A run_batch that records its batches and can be held inside a batch."""

    def __init__(self) -> None:
        self.batches: list[tuple[Hashable, list[int], str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail_on: set[int] = set()
        self.unheld: set[Hashable] = set()  # keys whose batches never wait for `release`

    def __call__(self, key: Hashable, items: list[int]) -> Sequence[int | Exception]:
        self.batches.append((key, list(items), threading.current_thread().name))
        self.entered.set()
        assert key in self.unheld or self.release.wait(30)
        if self.fail_on & set(items):
            raise RuntimeError(f"batch {items} failed")
        return [ValueError(item) if item < 0 else item * 10 for item in items]


def wait_until(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.001)


def start(combiner: Combiner, key: Hashable, item: int, answers: dict) -> threading.Thread:  # type: ignore[type-arg]
    def run() -> None:
        try:
            answers[item] = combiner.submit(key, item)
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            answers[item] = exc

    thread = threading.Thread(target=run, name=f"caller-{item}")
    thread.start()
    return thread


def hold_first_batch(combiner: Combiner, recorder: Recorder, key: Hashable, answers: dict):  # type: ignore[no-untyped-def,type-arg]
    """A leader stuck inside its batch of one, so that the next callers queue behind it."""
    recorder.release.clear()
    recorder.entered.clear()
    leader = start(combiner, key, 1, answers)
    assert recorder.entered.wait(30)
    return leader


def test_a_lone_item_runs_at_once_in_its_callers_thread() -> None:
    recorder = Recorder()
    combiner = Combiner(recorder, cap=lambda: 8)
    reset_batch_sizes()
    assert combiner.submit("a", 7) == 70
    assert recorder.batches == [("a", [7], threading.current_thread().name)]
    assert batch_sizes() == {1: 1}
    assert combiner.pending("a") == 0


def test_items_arriving_during_a_batch_form_the_next_one_in_order() -> None:
    recorder = Recorder()
    combiner = Combiner(recorder, cap=lambda: 8)
    answers: dict = {}  # type: ignore[type-arg]
    leader = hold_first_batch(combiner, recorder, "a", answers)
    followers = []
    for item in (2, 3, 4):
        followers.append(start(combiner, "a", item, answers))
        wait_until(lambda n=item: combiner.pending("a") == n - 1)  # arrival order is item order
    recorder.release.set()
    for thread in [leader, *followers]:
        thread.join(30)
    assert [items for _, items, _ in recorder.batches] == [[1], [2, 3, 4]]
    # The oldest waiting caller led the second batch.
    assert recorder.batches[1][2] == "caller-2"
    assert answers == {1: 10, 2: 20, 3: 30, 4: 40}


def test_batches_never_exceed_the_cap() -> None:
    recorder = Recorder()
    combiner = Combiner(recorder, cap=lambda: 3)
    answers: dict = {}  # type: ignore[type-arg]
    leader = hold_first_batch(combiner, recorder, "a", answers)
    followers = []
    for item in range(2, 9):
        followers.append(start(combiner, "a", item, answers))
        wait_until(lambda n=item: combiner.pending("a") == n - 1)  # arrival order is item order
    recorder.release.set()
    for thread in [leader, *followers]:
        thread.join(30)
    assert [items for _, items, _ in recorder.batches] == [[1], [2, 3, 4], [5, 6, 7], [8]]
    assert answers == {item: item * 10 for item in range(1, 9)}


def test_a_failing_batch_answers_each_member_with_the_error_and_the_next_caller_leads() -> None:
    recorder = Recorder()
    recorder.fail_on = {2}
    combiner = Combiner(recorder, cap=lambda: 2)
    answers: dict = {}  # type: ignore[type-arg]
    leader = hold_first_batch(combiner, recorder, "a", answers)
    followers = []
    for item in (2, 3, 4):
        followers.append(start(combiner, "a", item, answers))
        wait_until(lambda n=item: combiner.pending("a") == n - 1)
    recorder.release.set()
    for thread in [leader, *followers]:
        thread.join(30)
    assert [items for _, items, _ in recorder.batches] == [[1], [2, 3], [4]]
    assert isinstance(answers[2], RuntimeError) and isinstance(answers[3], RuntimeError)
    assert answers[1] == 10 and answers[4] == 40
    assert combiner.submit("a", 5) == 50  # nothing left stuck


def test_an_error_answer_is_raised_in_its_own_callers_thread_only() -> None:
    recorder = Recorder()
    combiner = Combiner(recorder, cap=lambda: 8)
    answers: dict = {}  # type: ignore[type-arg]
    leader = hold_first_batch(combiner, recorder, "a", answers)
    followers = [start(combiner, "a", item, answers) for item in (-2, 3)]
    wait_until(lambda: combiner.pending("a") == 2)
    recorder.release.set()
    for thread in [leader, *followers]:
        thread.join(30)
    assert isinstance(answers[-2], ValueError)
    assert answers[3] == 30


def test_no_caller_waits_on_another_keys_batch() -> None:
    recorder = Recorder()
    combiner = Combiner(recorder, cap=lambda: 8)
    answers: dict = {}  # type: ignore[type-arg]
    leader = hold_first_batch(combiner, recorder, "a", answers)
    recorder.unheld.add("b")
    assert combiner.submit("b", 9) == 90  # while key a's batch is still held
    assert not recorder.release.is_set() and leader.is_alive()
    recorder.release.set()
    leader.join(30)
    assert answers[1] == 10


def test_a_caller_may_give_up_only_while_its_item_is_pending() -> None:
    recorder = Recorder()
    combiner = Combiner(recorder, cap=lambda: 8)
    answers: dict = {}  # type: ignore[type-arg]
    leader = hold_first_batch(combiner, recorder, "a", answers)
    with pytest.raises(GaveUp):
        combiner.submit("a", 2, timeout=0.01)
    assert combiner.pending("a") == 0
    recorder.release.set()
    leader.join(30)
    assert [items for _, items, _ in recorder.batches] == [[1]]  # item 2 never ran
    assert combiner.submit("a", 3, timeout=0.01) == 30  # a lone item runs at once


def test_a_failure_before_the_batch_runs_answers_its_leader_and_frees_the_key() -> None:
    """Reading the cap (or counting the batch) fails: the leader hears the error, and the
    activity's next caller leads at once instead of queueing behind a leader that left."""
    failures = [RuntimeError("the cap could not be read")]

    def cap() -> int:
        if failures:
            raise failures.pop()
        return 4

    combiner: Combiner[int, int] = Combiner(Recorder(), cap=cap)
    with pytest.raises(RuntimeError, match="cap could not be read"):
        combiner.submit("a", 1)
    assert combiner.submit("a", 2, timeout=5) == 20  # GaveUp if the key were still taken
    assert combiner.pending("a") == 0


class Arrivals:
    """A pause that lets the next caller of `items` arrive (queued on the line) each time it
    is called, and counts the pauses."""

    def __init__(self, combiner: Combiner, key: Hashable, items: list[int], answers: dict) -> None:  # type: ignore[type-arg]
        self.combiner, self.key, self.items, self.answers = combiner, key, list(items), answers
        self.pauses = 0
        self.threads: list[threading.Thread] = []

    def __call__(self) -> None:
        self.pauses += 1
        if self.items:
            waiting = self.combiner.pending(self.key)
            self.threads.append(start(self.combiner, self.key, self.items.pop(0), self.answers))
            wait_until(lambda: self.combiner.pending(self.key) == waiting + 1)


def hand_the_lead_to_a_second_caller(combiner: Combiner, recorder: Recorder, answers: dict) -> None:  # type: ignore[type-arg]
    """Item 1 leads a held batch while item 2 queues; released, 1 hands 2 the lead. Returns
    when both are answered."""
    leader = hold_first_batch(combiner, recorder, "a", answers)
    second = start(combiner, "a", 2, answers)
    wait_until(lambda: combiner.pending("a") == 1)
    recorder.release.set()
    for thread in [leader, second]:
        thread.join(30)


@pytest.mark.parametrize(
    ("cap", "gather", "arriving", "batches", "pauses"),
    [
        # The line grows at each pause, then stops: one pause finds no newcomer.
        (8, 4, [3, 4], [[1], [2, 3, 4]], 3),
        # At most `gather` pauses, though callers would go on arriving (6 never comes).
        (8, 3, [3, 4, 5, 6], [[1], [2, 3, 4, 5]], 3),
        # None once the line holds the rest of a full batch (5 never comes).
        (3, 4, [3, 4, 5], [[1], [2, 3, 4]], 2),
        # gather 0: never.
        (8, 0, [3], [[1], [2]], 0),
        # An empty line: one pause, in which nobody comes.
        (8, 4, [], [[1], [2]], 1),
    ],
)
def test_a_caller_handed_the_lead_pauses_while_the_line_grows(
    cap: int, gather: int, arriving: list[int], batches: list[list[int]], pauses: int
) -> None:
    recorder = Recorder()
    answers: dict = {}  # type: ignore[type-arg]
    combiner: Combiner[int, int] = Combiner(recorder, cap=lambda: cap, gather=lambda: gather)
    arrivals = Arrivals(combiner, "a", arriving, answers)
    combiner.pause = arrivals
    hand_the_lead_to_a_second_caller(combiner, recorder, answers)
    for thread in arrivals.threads:
        thread.join(30)
    expected = [1, 2, *arriving[:pauses]]
    assert [items for _, items, _ in recorder.batches] == batches
    assert arrivals.pauses == pauses
    assert {item: answers[item] for item in expected} == {item: item * 10 for item in expected}


def test_a_lone_caller_leads_without_pausing() -> None:
    recorder = Recorder()
    combiner: Combiner[int, int] = Combiner(recorder, cap=lambda: 8, gather=lambda: 4)
    arrivals = Arrivals(combiner, "a", [], {})
    combiner.pause = arrivals
    assert combiner.submit("a", 7) == 70
    assert arrivals.pauses == 0


def test_a_pause_that_fails_answers_the_handed_leader_and_the_lead_moves_on() -> None:
    """Whatever fails while a handed-over leader gathers, the callers behind it are answered:
    the lead passes on and nothing waits forever."""
    recorder = Recorder()
    failures = [RuntimeError("the pause failed")]

    def pause() -> None:
        if failures:
            raise failures.pop()

    combiner: Combiner[int, int] = Combiner(recorder, cap=lambda: 8, gather=lambda: 4, pause=pause)
    answers: dict = {}  # type: ignore[type-arg]
    leader = hold_first_batch(combiner, recorder, "a", answers)
    followers = [start(combiner, "a", item, answers) for item in (2, 3)]
    wait_until(lambda: combiner.pending("a") == 2)
    recorder.release.set()
    for thread in [leader, *followers]:
        thread.join(30)
    assert isinstance(answers[2], RuntimeError)
    assert answers[1] == 10 and answers[3] == 30
    assert combiner.pending("a") == 0
    assert combiner.submit("a", 4, timeout=5) == 40


def test_the_default_pause_gives_up_the_interpreter_without_a_timeout(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    slept: list[float] = []
    monkeypatch.setattr(combiner_module.time, "sleep", slept.append)
    recorder = Recorder()
    combiner: Combiner[int, int] = Combiner(recorder, cap=lambda: 8, gather=lambda: 4)
    answers: dict = {}  # type: ignore[type-arg]
    hand_the_lead_to_a_second_caller(combiner, recorder, answers)
    assert slept == [0]  # one pause: the line was empty and did not grow
    assert answers == {1: 10, 2: 20}


@pytest.mark.parametrize("strategy", ["group_commit", "redis_queue", "redis_counter"])
def test_the_batched_strategies_gather_as_the_setting_says(settings, strategy: str) -> None:  # type: ignore[no-untyped-def]
    from strategies import registry

    combiner = registry.get(strategy).combiner
    settings.REDPACK_BATCH_GATHER = 7
    assert combiner.gather() == 7
    settings.REDPACK_BATCH_GATHER = 0
    assert combiner.gather() == 0
