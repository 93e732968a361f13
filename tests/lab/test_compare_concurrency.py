"""The bench's grabs in flight per strategy in `compare`: a strategy that combines grabs runs
with enough of them that its batches reach the raw batched ceiling's 32 per transaction."""

import socket

import pytest

from redpack.lab import compare as compare_module
from redpack.lab.compare import Compare, CompareConfig, bench_concurrency
from strategies import registry

COMBINING = {"group_commit", "redis_queue", "redis_counter", "redis_queue_async"}


def test_the_strategies_that_combine_grabs_are_benched_with_more_in_flight():
    config = CompareConfig(concurrency=64, batched_concurrency=128)
    in_flight = {name: bench_concurrency(config, name) for name in registry.names()}
    assert {name for name, count in in_flight.items() if count == 128} == COMBINING
    assert {count for name, count in in_flight.items() if name not in COMBINING} == {64}
    assert "redis_queue_single" in in_flight  # the seeds' form of redis_queue: one at a time


def test_compare_refuses_a_bench_that_mysql_has_no_connections_for(db, tmp_path):
    """Before any run, not as a failed audit halfway through (each bench thread keeps a
    connection of its own)."""
    config = CompareConfig(
        strategies=["group_commit", "pessimistic"],
        batched_concurrency=1_000_000,
        work_dir=tmp_path,
        out_dir=tmp_path,
    )
    with pytest.raises(RuntimeError, match="--batched-concurrency"):
        Compare(config, log=lambda line: None)._check_connections()
    fitting = CompareConfig(strategies=["pessimistic"], concurrency=2, work_dir=tmp_path)
    Compare(fitting, log=lambda line: None)._check_connections()  # room enough: no error


def test_an_http_run_waits_for_the_server_to_close_earlier_connections_or_says_it_did_not(
    db, tmp_path, monkeypatch
):
    """`_quiet` before each HTTP run: a server still holding a connection at the timeout is
    counted (the report warns of each) and logged."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    lines: list[str] = []
    config = CompareConfig(port=server.getsockname()[1], work_dir=tmp_path, out_dir=tmp_path)
    compare = Compare(config, log=lines.append)
    monkeypatch.setattr(compare_module, "QUIET_TIMEOUT_SECONDS", 0)
    try:
        compare._quiet()
        assert compare.not_quiet == 1 and "holds connections" in lines[-1]
        client.close()
        accepted.close()
        monkeypatch.setattr(compare_module, "QUIET_TIMEOUT_SECONDS", 30)
        compare._quiet()
        assert compare.not_quiet == 1
    finally:
        server.close()
