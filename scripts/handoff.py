"""What the combiner's hand-offs between threads cost, with no store behind them.

Threads of one process submit to one key of a Combiner (strategies/combiner.py) whose batch
only sleeps for a stand-in round trip, as the bench's threads do with a real grab script; the
script prints the process's CPU per submitted item, split into user and kernel time, and the
mean batch. Whatever it prints is paid by every batched strategy on top of its own work: a
waiting member is woken once for its answer, then waits for the GIL. Compare thread counts
within one run of this script, not across machines.

    DJANGO_SETTINGS_MODULE=redpack.settings .venv/bin/python scripts/handoff.py \
        --threads 1 8 32 --items 100000 --round-trip-us 100
"""

import argparse
import itertools
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(threads: int, items: int, round_trip: float) -> str:
    from strategies.combiner import Combiner, batch_sizes, reset_batch_sizes

    def run_batch(key: object, batch: list[int]) -> list[int]:
        time.sleep(round_trip)
        return batch

    combiner: Combiner[int, int] = Combiner(run_batch, cap=lambda: 64)
    numbers = itertools.count()

    def submit_until_done() -> None:
        while (number := next(numbers)) < items:
            combiner.submit("key", number)

    reset_batch_sizes()
    pool = [threading.Thread(target=submit_until_done) for _ in range(threads)]
    before, started = os.times(), time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    after, ended = os.times(), time.perf_counter()
    user = (after.user - before.user) / items * 1e6
    kernel = (after.system - before.system) / items * 1e6
    sizes = batch_sizes()
    mean = sum(size * count for size, count in sizes.items()) / sum(sizes.values())
    return (
        f"{threads:4d} threads: CPU {user + kernel:6.1f} µs per item (user {user:5.1f},"
        f" kernel {kernel:5.1f}), wall {(ended - started) / items * 1e6:6.1f} µs,"
        f" mean batch {mean:5.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--round-trip-us", type=float, default=100.0)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")
    import django

    django.setup()
    for threads in args.threads:
        print(measure(threads, args.items, args.round_trip_us / 1e6), flush=True)


if __name__ == "__main__":
    main()
