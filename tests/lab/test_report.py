"""The comparison report from given results: markdown, chart, ceilings."""

from redpack.lab import report
from redpack.lab.compare import assign_ceilings, storage_bound


def row(strategy: str, run: str, rate: float, **extra: object) -> dict:
    base = {
        "strategy": strategy,
        "safe": True,
        "run": run,
        "requests_per_s": rate,
        "grabs_per_s": rate / 2,
        "success_rate": 1.0,
        "contended_share": 0.0,
        "oversold": 0,
        "duplicates": 0,
        "p50_ms": 2.0,
        "p95_ms": 5.0,
        "p99_ms": 9.5,
        "mysql_queries_per_request": 6.0,
        "mysql_queries_per_request_own": 6.0,
        "redis_commands_per_request": 0.0,
        "cpu_seconds_per_1k_requests": 1.5,
        "settle_seconds": 0.0,
        "audit_ok": True,
    }
    base.update(extra)
    return base


CEILINGS = [
    {
        "name": "MySQL: hot-row UPDATE",
        "kind": "mysql",
        "tool": "mysqlslap",
        "requests_per_s": 5000.0,
    },
    {
        "name": "Redis: representative",
        "kind": "redis",
        "tool": "redis-benchmark",
        "requests_per_s": 40000.0,
        "p50_ms": 0.2,
        "p99_ms": 1.0,
    },
    {"name": "Web: ping", "kind": "web", "tool": "Locust", "requests_per_s": 2000.0},
    {"name": "Web: ping, wrk", "kind": "web_wrk", "tool": "wrk", "requests_per_s": 2500.0},
    {"name": "Web: ping burst", "kind": "web_burst", "tool": "wrk", "requests_per_s": 1250.0},
    {
        "name": "MySQL: raw grab transaction, 1 grab(s) each",
        "kind": "mysql_raw",
        "tool": "mysqlclient threads -c 16",
        "requests_per_s": 2000.0,
    },
    {
        "name": "MySQL: raw grab transaction, 32 grab(s) each",
        "kind": "mysql_raw_batched",
        "tool": "mysqlclient threads -c 16",
        "requests_per_s": 10000.0,
    },
    {
        "name": "MySQL: raw preallocated statements, 1 grab each",
        "kind": "mysql_raw_seed",
        "tool": "mysqlclient threads -c 16",
        "requests_per_s": 800.0,
        "strategy": "preallocated",
    },
    {
        "name": "MySQL: raw redis_counter batch transaction, 32 grabs each",
        "kind": "mysql_raw_batch_own",
        "tool": "mysqlclient threads -c 16",
        "requests_per_s": 24000.0,
        "strategy": "redis_counter",
    },
]


def results() -> list[dict]:
    rows = [
        row("pessimistic", "bench hot", 1000.0),
        row("pessimistic", "HTTP hot", 800.0, requests=10_000, p99_ms=5_900.0),
        row("pessimistic", "HTTP hot (wrk)", 1000.0, requests=10_000, p99_ms=9_000.0),
        row("group_commit", "HTTP hot (wrk)", 1000.0, requests=10_000, p99_ms=9_001.0),
        row(
            "redis_queue_async",
            "bench throughput",
            10000.0,
            mysql_queries_per_request_own=0.1,
            redis_commands_per_request=1.0,
            settle_seconds=1.25,
        ),
        row("redis_queue_async", "HTTP throughput", 1500.0, mysql_queries_per_request=0.1),
        row("group_commit", "bench throughput", 4000.0),
        row("redis_counter", "bench throughput", 6000.0, mysql_queries_per_request_own=0.2),
        row("preallocated", "bench throughput", 600.0, mysql_queries_per_request_own=8.0),
        row("optimistic", "bench throughput", 500.0),
        row("unsafe", "bench hot", 3000.0, safe=False, oversold=42, audit_ok=False),
    ]
    assign_ceilings(rows, CEILINGS)
    return rows


def test_each_run_gets_the_ceiling_that_bounds_it():
    rows = {(r["strategy"], r["run"]): r for r in results()}

    # A seed's MySQL strategy: its SQL run raw, one grab per transaction.
    assert rows["pessimistic", "bench hot"]["ceiling"].startswith("MySQL: raw grab transaction, 1")
    assert rows["pessimistic", "bench hot"]["ceiling_ratio"] == 0.5
    assert rows["redis_queue_async", "bench throughput"]["ceiling"] == "Redis: representative"
    assert rows["redis_queue_async", "bench throughput"]["ceiling_ratio"] == 0.25
    # Over HTTP the web server's ping rate is lower than Redis's: that is the ceiling.
    assert rows["redis_queue_async", "HTTP throughput"]["ceiling"] == "Web: ping"
    assert rows["redis_queue_async", "HTTP throughput"]["ceiling_ratio"] == 0.75
    # The batched strategies: the ceilings.
    assert rows["group_commit", "bench throughput"]["ceiling"] == "MySQL: hot-row UPDATE"
    assert rows["group_commit", "bench throughput"]["ceiling_ratio"] == 0.8
    assert rows["redis_counter", "bench throughput"]["ceiling_ratio"] == 0.6
    # Beside it, the share of the strategy's own SQL run raw: its batch transaction, or a
    # seed's statements; none for a strategy without statements of its own.
    assert rows["redis_counter", "bench throughput"]["own_sql_ratio"] == 0.25
    assert rows["preallocated", "bench throughput"]["own_sql_ratio"] == 0.75
    assert "own_sql_ratio" not in rows["group_commit", "bench throughput"]
    # A seed with statements of its own: those statements, run raw; the others: pessimistic's.
    assert rows["preallocated", "bench throughput"]["ceiling"].startswith("MySQL: raw prealloc")
    assert rows["preallocated", "bench throughput"]["ceiling_ratio"] == 0.75
    assert rows["optimistic", "bench throughput"]["ceiling"].startswith("MySQL: raw grab transa")
    assert storage_bound([{"mysql_queries_per_request_own": 0.02}]) == "redis"
    assert storage_bound([{"mysql_queries_per_request_own": 5}]) == "mysql"
    # A hot run answered from memory once sold out says nothing of what a grab costs.
    hot = {"run": "bench hot", "mysql_queries_per_request_own": 0.03}
    real = {"run": "bench throughput", "mysql_queries_per_request_own": 5.0}
    assert storage_bound([hot, real]) == "mysql"


def test_a_hot_burst_p99_is_held_to_the_ping_in_its_own_shape_and_to_the_kept_alive_one():
    rows = {(r["strategy"], r["run"]): r for r in results()}

    # wrk: 10,000 requests ÷ the ping burst's 1,250/s + 1 s, and ÷ wrk's kept-alive 2,500/s + 1 s.
    within = rows["pessimistic", "HTTP hot (wrk)"]
    assert within["p99_budget_burst_ms"] == 9_000.0 and within["p99_within_burst"]
    assert within["p99_budget_kept_alive_ms"] == 5_000.0 and not within["p99_within_kept_alive"]
    assert not rows["group_commit", "HTTP hot (wrk)"]["p99_within_burst"]
    assert report.budget_cell(within) == (
        "9,000 met (ping burst); 5,000 **over** (kept-alive ping)"
    )
    # Locust has no burst of its own: its kept-alive ping, 10,000 ÷ 2,000/s + 1 s.
    locust = rows["pessimistic", "HTTP hot"]
    assert "p99_budget_burst_ms" not in locust
    assert report.budget_cell(locust) == "6,000 met (kept-alive ping)"
    assert report.budget_cell(rows["redis_queue_async", "HTTP throughput"]) == "–"
    # Without a burst ceiling, or with a p99 missing, nothing is claimed met.
    hot = {(r["strategy"], r["run"]): r for r in results()}["group_commit", "HTTP hot (wrk)"]
    no_burst = [c for c in CEILINGS if c["kind"] != "web_burst"]
    bare = dict(hot, p99_ms=None)
    for key in list(bare):
        if key.startswith("p99_budget") or key.startswith("p99_within"):
            del bare[key]
    assign_ceilings([bare], no_burst)
    assert "p99_budget_burst_ms" not in bare and bare["p99_within_kept_alive"] is False


def test_a_hot_burst_p99_is_held_to_the_ping_bursts_beside_it_when_measured():
    """The ping bursts measured again just before and after the hot burst (their mean,
    `ping_burst_beside_per_s`) set the budget: 10,000 ÷ 2,000/s + 1 s, not the start's
    10,000 ÷ 1,250/s + 1 s."""
    hot = {(r["strategy"], r["run"]): r for r in results()}["pessimistic", "HTTP hot (wrk)"]
    fresh = {k: v for k, v in hot.items() if not k.startswith("p99_")}
    beside = dict(fresh, p99_ms=8_000.0, ping_burst_beside_per_s=2_000.0)
    assign_ceilings([beside], CEILINGS)
    assert beside["p99_budget_burst_ms"] == 6_000.0 and not beside["p99_within_burst"]
    alone = dict(fresh, p99_ms=8_000.0)
    assign_ceilings([alone], CEILINGS)
    assert alone["p99_budget_burst_ms"] == 9_000.0 and alone["p99_within_burst"]


def test_markdown_has_a_row_per_run_and_flags_broken_invariants(tmp_path):
    path = tmp_path / "compare.md"
    report.write_markdown(
        path, results=results(), ceilings=CEILINGS, context={"commit": "abc1234", "cpus": 2}
    )
    text = path.read_text()

    header = next(line for line in text.splitlines() if line.startswith("| strategy"))
    for column in (
        "requests/s",
        "grabs/s",
        "success",
        "contended",
        "oversold",
        "p99 ms",
        "MySQL q/req",
        "Redis cmd/req",
        "CPU s/1k req",
        "persist lag s",
        "of ceiling",
    ):
        assert column in header
    rows = [line for line in text.splitlines() if line.startswith("| ") and "|---" not in line]
    # Results, then the bench rows again under "Cost per request".
    assert sum("bench hot" in line for line in rows) == 4
    assert "## Cost per request" in text and "| client CPU µs |" in text
    unsafe = next(line for line in rows if line.startswith("| unsafe"))
    assert "**42**" in unsafe and "**FAILED**" in unsafe
    assert "| 50.0% |" in next(line for line in rows if line.startswith("| pessimistic"))
    assert "MySQL: hot-row UPDATE | mysqlslap | 5,000" in text
    # Server-wide count first; the bench's own count when other clients blurred it.
    assert "| 6.00 |" in next(line for line in rows if line.startswith("| pessimistic"))
    noisy = [row("pessimistic", "bench hot", 1.0, mysql_queries_per_request=9.0)]
    assert "| 9.00 (own 6.00) |" in report.results_table(noisy)
    assert "![throughput and p99 per strategy](compare.png)" in text


def test_persist_lag_column_only_when_a_strategy_lags(tmp_path):
    synchronous = [row("pessimistic", "bench hot", 100.0)]
    path = tmp_path / "compare.md"
    report.write_markdown(path, results=synchronous, ceilings=[], context={})

    header = next(line for line in path.read_text().splitlines() if line.startswith("| strategy"))
    assert "persist lag" not in header


def test_chart_is_a_png(tmp_path):
    path = tmp_path / "compare.png"
    report.write_chart(path, results=results(), ceilings=CEILINGS)

    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert path.stat().st_size > 10_000


def test_a_runs_steal_is_flagged_only_when_it_is_five_points_from_the_pings_beside_it():
    assert report.steal_cell(0.07, 0.03) == "7% (ping 3%)"
    assert report.steal_cell(0.03, 0.08) == "**3%** (ping 8%)"
    assert report.steal_cell(0.04, None) == "4%"
    assert report.steal_cell(None, 0.04) == "–"


def test_http_runs_show_every_requests_cause_latency_and_the_generators_cpu(tmp_path):
    http = row(
        "pessimistic",
        "HTTP hot",
        900.0,
        requests=10_000,
        unanswered=3,
        causes={"grabbed": 100, "sold_out": 9_890, "shed": 7, "client_timeout": 3},
        max_ms=4_100.0,
        within_1s=0.925,
        latency_histogram={"≤10 ms": 9_000, "≤1000 ms": 250, "≤5000 ms": 750},
        generator_cpu_share=0.95,
        generator_bound=True,
        steal_share=0.02,
    )
    many = row(
        "redis_counter",
        "HTTP throughput (wrk)",
        1_200.0,
        requests=18_000,
        causes={"grabbed": 18_000},
        within_1s=1.0,
        ping_beside_per_s=1_500.0,
        of_ping_beside=0.8,
        of_ping_before=0.75,
        of_ping_after=0.8571,
        generator_cpu_share=0.05,
        steal_share=0.12,
        steal_share_beside=0.03,
    )
    path = tmp_path / "compare.md"
    report.write_markdown(path, results=[http, many], ceilings=[], context={}, chart=None)
    text = path.read_text()

    assert "## Over HTTP: every request's answer and wait" in text
    line = next(x for x in text.splitlines() if x.startswith("| pessimistic | HTTP hot | 10,000"))
    assert "| **3** |" in line  # unanswered, flagged
    assert "grabbed 100, sold_out 9,890, shed 7, client_timeout 3" in line
    assert "| 4,100 | 92.5% | – | 95% **generator-bound** | 2% |" in line
    # A many-packets run against the pings just before and after it.
    line = next(
        x for x in text.splitlines() if x.startswith("| redis_counter | HTTP thr") and "18,000" in x
    )
    # The hypervisor took 12% of the machine over the run, 3% over the ping: flagged.
    assert "| 100.0% | 80.0% (75.0–85.7%) | 5% | **12%** (ping 3%) |" in line
    histogram = next(x for x in text.splitlines() if x.startswith("| strategy | run | ≤10 ms"))
    assert histogram.endswith("| ≤10 ms | ≤1000 ms | ≤5000 ms |")
    assert "| pessimistic | HTTP hot | 9,000 | 250 | 750 |" in text


def test_a_ceiling_ping_that_lost_requests_says_so_first_in_its_note() -> None:
    ceilings = [
        {
            "name": "burst",
            "tool": "wrk",
            "requests_per_s": 480.0,
            "note": "9,963 of 10,000",
            "failed": 37,
        },
        {"name": "kept", "tool": "wrk", "requests_per_s": 650.0, "note": "", "failed": 2},
        {"name": "locust", "tool": "Locust", "requests_per_s": 300.0, "note": "", "failed": 0},
    ]
    table = report.ceilings_table(ceilings).splitlines()
    assert table[2].endswith("| **37 without a 200**; 9,963 of 10,000 |")
    assert table[3].endswith("| **2 without a 200** |")
    assert "without a 200" not in table[4]
