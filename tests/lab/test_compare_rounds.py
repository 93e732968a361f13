"""Repeated rounds of wrk's runs (compare --rounds): the median round's row is kept
(compare.median_round), what must hold in every round is taken from all of them, and the report
lists every round (report.rounds_cell)."""

import pytest
from django.core.management import CommandError, call_command

from redpack.lab import report
from redpack.lab.compare import Compare, CompareConfig, median_round, round_figure

MANY = "HTTP throughput (wrk)"
HOT = "HTTP hot (wrk)"


def many(share: float | None, rate: float, **extra: object) -> dict:
    row = {"strategy": "group_commit", "run": MANY, "requests_per_s": rate, "audit_ok": True}
    if share is not None:
        row["of_ping_beside"] = share
    return {**row, "oversold": 0, "unanswered": 0, "violations": [], **extra}


def hot(p99_ms: float, ping_burst_per_s: float | None, **extra: object) -> dict:
    row = {
        "strategy": "redis_counter",
        "run": HOT,
        "requests": 10_000,
        "p99_ms": p99_ms,
        "audit_ok": True,
        "oversold": 0,
        "unanswered": 0,
        "violations": [],
    }
    if ping_burst_per_s is not None:
        row["ping_burst_beside_per_s"] = ping_burst_per_s
    return {**row, **extra}


def test_the_many_packets_rounds_keep_the_median_share() -> None:
    kept = median_round([many(0.72, 1_000.0), many(0.86, 1_200.0), many(0.79, 1_100.0)])

    assert kept["of_ping_beside"] == 0.79
    assert kept["requests_per_s"] == 1_100.0
    assert kept["median_round"] == 3
    assert [r["figure"] for r in kept["rounds"]] == [0.72, 0.86, 0.79]


def test_of_an_even_number_the_worse_of_the_two_in_the_middle_is_kept() -> None:
    rows = [many(0.90, 1.0), many(0.70, 1.0), many(0.80, 1.0), many(0.85, 1.0)]

    assert median_round(rows)["of_ping_beside"] == 0.80
    assert median_round(rows[:2])["of_ping_beside"] == 0.70


def test_a_round_without_its_ping_ranks_last() -> None:
    kept = median_round([many(None, 900.0), many(0.81, 1.0), many(0.75, 1.0)])

    assert kept["of_ping_beside"] == 0.75
    assert kept["rounds"][0]["figure"] is None


def test_the_hot_rounds_keep_the_median_room_left_in_the_budget() -> None:
    # budgets: 10,000 ÷ 1,250/s + 1 s = 9 s; 10,000 ÷ 1,000/s + 1 s = 11 s
    rows = [hot(8_000.0, 1_250.0), hot(9_500.0, 1_250.0), hot(9_500.0, 1_000.0)]

    assert [round_figure(r) for r in rows] == [1_000.0, -500.0, 1_500.0]
    kept = median_round(rows)
    assert kept["median_round"] == 1
    assert kept["rounds"][1] == {
        "figure": -500.0,
        "requests_per_s": None,
        "p99_ms": 9_500.0,
        "p99_budget_ms": 9_000.0,
        "unanswered": 0,
        "causes": {},
        "audit_ok": True,
        "activity_id": None,
    }


def test_a_hot_round_without_ping_bursts_beside_it_reads_the_one_at_the_start() -> None:
    start = {"kind": "web_burst", "requests_per_s": 1_000.0}  # budget 11 s
    rows = [hot(12_000.0, None), hot(9_500.0, 1_250.0), hot(8_000.0, 1_250.0)]

    kept = median_round(rows, start_burst=start)

    assert [r["figure"] for r in kept["rounds"]] == [-1_000.0, -500.0, 1_000.0]
    assert kept["rounds"][0]["p99_budget_ms"] == 11_000.0
    assert kept["median_round"] == 2


def test_what_must_hold_in_every_round_is_taken_from_all_of_them() -> None:
    failed = many(0.60, 1.0, audit_ok=False, oversold=2, violations=["2 packets too many"])
    lost = many(0.95, 1.0, unanswered=3, causes={"grabbed": 9, "connection_error": 3})

    kept = median_round([failed, many(0.80, 1.0), lost])

    assert kept["of_ping_beside"] == 0.80
    assert kept["audit_ok"] is False
    assert kept["oversold"] == 2
    assert kept["violations"] == ["round 1: 2 packets too many"]
    assert kept["unanswered"] == 0  # the kept round's; the rounds column shows the others
    assert kept["rounds"][2]["causes"] == {"grabbed": 9, "connection_error": 3}


def test_the_report_lists_every_round_and_flags_a_failed_one() -> None:
    kept = median_round([many(0.72, 1.0), many(0.80, 1.0, audit_ok=False)])
    errors = {"sold_out": 9_990, "5xx": 6, "client_timeout": 4, "shed": 50}
    hot_kept = median_round([hot(8_000.0, 1_250.0), hot(9_500.0, 1_250.0, causes=errors)])

    assert report.cell(kept["rounds"], "rounds") == "0.72; 0.80 **audit FAILED**"
    assert report.cell(hot_kept["rounds"], "rounds") == (
        "8.00 of 9.00 s; 9.50 of 9.00 s **6 5xx** **4 client_timeout**"
    )
    table = report.results_table([kept], report.http_columns([kept]))
    assert "rounds (the median kept)" in table


def test_the_rounds_column_is_left_out_when_nothing_was_repeated() -> None:
    columns = report.http_columns([many(0.8, 1.0)])
    assert "rounds" not in [key for key, _, _ in columns]


def test_each_round_runs_with_its_own_logs_and_leaves_one_row(tmp_path, monkeypatch) -> None:
    config = CompareConfig(
        strategies=["group_commit"], rounds=3, out_dir=tmp_path, work_dir=tmp_path / "logs"
    )
    compare = Compare(config, log=lambda line: None)
    compare.results.append(many(0.9, 1.0, run="bench hot"))  # an earlier run's row stays
    labels: list[str] = []
    shares = iter([0.74, 0.78, 0.70])

    def one_round(name: str, scenario: str) -> None:
        labels.append(compare.round_label)
        compare.results.append(many(next(shares), 1.0))

    monkeypatch.setattr(compare, "_wrk", one_round)

    compare._wrk_rounds("group_commit", "throughput")

    assert labels == ["-r1", "-r2", "-r3"] and compare.round_label == ""
    assert [row["run"] for row in compare.results] == ["bench hot", MANY]
    assert compare.results[1]["of_ping_beside"] == 0.74
    assert compare.results[1]["median_round"] == 1


def test_compare_refuses_fewer_than_one_round() -> None:
    with pytest.raises(ValueError, match="rounds must be 1 or more, not 0"):
        CompareConfig(rounds=0)
    with pytest.raises(CommandError, match="--rounds must be 1 or more, not 0"):
        call_command("compare", "--rounds", "0", "--skip-http", "--skip-bench")


def test_a_ping_without_a_200_in_any_round_stays_with_the_kept_row_and_in_the_report() -> None:
    lossy = ["the ping burst before it: 37 without a 200"]
    rows = [hot(20_000.0, 500.0, pings_failed=lossy), hot(15_000.0, 500.0), hot(17_000.0, 500.0)]

    kept = median_round(rows)

    assert kept["median_round"] == 3
    assert kept["pings_failed"] == ["round 1: the ping burst before it: 37 without a 200"]
    assert "pings_failed" not in median_round(rows[1:])
    keys = [key for key, _, _ in report.http_columns([kept])]
    assert "pings_failed" in keys
    assert "pings_failed" not in [key for key, _, _ in report.http_columns(rows[1:])]
    assert report.cell(kept["pings_failed"], "pings_failed") == (
        "**round 1: the ping burst before it: 37 without a 200**"
    )
