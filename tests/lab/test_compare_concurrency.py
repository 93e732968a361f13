"""The bench's grabs in flight per strategy in `compare`: a strategy that combines grabs runs
with enough of them that its batches reach the raw batched ceiling's 32 per transaction."""

from redpack.lab.compare import CompareConfig, bench_concurrency
from strategies import registry

COMBINING = {"group_commit", "redis_queue", "redis_counter", "redis_queue_async"}


def test_the_strategies_that_combine_grabs_are_benched_with_more_in_flight():
    config = CompareConfig(concurrency=64, batched_concurrency=128)
    in_flight = {name: bench_concurrency(config, name) for name in registry.names()}
    assert {name for name, count in in_flight.items() if count == 128} == COMBINING
    assert {count for name, count in in_flight.items() if name not in COMBINING} == {64}
    assert "redis_queue_single" in in_flight  # the seeds' form of redis_queue: one at a time
