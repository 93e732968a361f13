"""The pings on either side of a run: a many-packets run's share of them (compare.ping_bracket),
a hot burst's budget from the ping bursts (compare.burst_bracket), and what fails a comparison
(compare.failures)."""

from redpack.lab.compare import Beside, burst_bracket, failures, not_answered_200, ping_bracket


def test_the_share_is_of_the_mean_with_each_side_beside_it() -> None:
    fields = ping_bracket(Beside(1_000.0, 0.02), Beside(1_500.0, 0.04), {"requests_per_s": 1_000.0})

    assert fields["ping_beside_per_s"] == 1_250.0
    assert fields["of_ping_beside"] == 0.8
    assert fields["of_ping_before"] == 1.0
    assert fields["of_ping_after"] == 0.6667
    assert fields["steal_share_beside"] == 0.03


def test_a_failed_ping_leaves_the_other() -> None:
    fields = ping_bracket(Beside(None, None), Beside(1_250.0, 0.0), {"requests_per_s": 1_000.0})

    assert fields == {
        "steal_share_beside": 0.0,
        "ping_beside_per_s": 1_250.0,
        "of_ping_beside": 0.8,
        "ping_after_per_s": 1_250.0,
        "of_ping_after": 0.8,
    }


def test_no_share_without_a_ping_or_a_rate() -> None:
    assert ping_bracket(Beside(None, None), Beside(None, None), {"requests_per_s": 900.0}) == {}
    assert "of_ping_beside" not in ping_bracket(
        Beside(1_000.0, None), Beside(1_000.0, None), {"requests_per_s": None}
    )


def test_a_hot_burst_reads_the_mean_of_the_ping_bursts_that_were_answered_in_full() -> None:
    assert burst_bracket(Beside(800.0, 0.0), Beside(700.0, 0.02)) == {
        "steal_share_beside": 0.01,
        "ping_burst_beside_per_s": 750.0,
        "ping_burst_before_per_s": 800.0,
        "ping_burst_after_per_s": 700.0,
    }
    # A burst not answered in full (or generator-bound) has no rate: the other one counts.
    assert burst_bracket(Beside(None, 0.0), Beside(700.0, 0.0))["ping_burst_beside_per_s"] == 700
    assert "ping_burst_beside_per_s" not in burst_bracket(Beside(None, 0.0), Beside(None, 0.0))


def test_a_ping_beside_a_run_without_a_200_for_every_request_is_recorded_by_side() -> None:
    lossy = {"requests": 10_000, "statuses": {"200": 9_963}}
    assert not_answered_200(lossy) == 37
    assert not_answered_200({"requests": 10_000, "statuses": {"200": 10_000}}) == 0
    assert not_answered_200({"requests": 900, "statuses": {"200": 880, "503": 20}}) == 20

    fields = burst_bracket(Beside(None, 0.0, 37), Beside(700.0, 0.0))

    assert fields["pings_failed"] == ["the ping burst before it: 37 without a 200"]
    assert fields["ping_burst_beside_per_s"] == 700  # the budget still has a ping burst
    assert "pings_failed" not in burst_bracket(Beside(800.0, 0.0), Beside(700.0, 0.0))
    # A many-packets run keeps its pings' losses even when neither ping gives a share.
    lost = ping_bracket(Beside(None, None), Beside(None, None, 2), {"requests_per_s": 900.0})
    assert lost == {"pings_failed": ["the ping after it: 2 without a 200"]}


def test_a_lost_ping_fails_the_comparison_whether_beside_a_run_or_measured_as_a_ceiling() -> None:
    ok = {"ok": True}
    answered = {"strategy": "redis_queue", "run": "HTTP hot (wrk)", "safe": True, "audit_ok": True}
    ceiling = {"name": "Web: GET /api/ping/ burst", "requests_per_s": 480.0}
    assert failures([answered], [ceiling], ok) == []

    lossy_run = {**answered, "pings_failed": ["the ping burst before it: 37 without a 200"]}
    assert failures([lossy_run], [ceiling], ok) == [
        "PINGS FAILED: redis_queue HTTP hot (wrk): ['the ping burst before it: 37 without a 200']"
    ]
    lossy_ceiling = {**ceiling, "failed": 1_200}
    assert failures([answered], [lossy_ceiling], ok) == [
        "PINGS FAILED: ceiling Web: GET /api/ping/ burst: 1,200 without a 200"
    ]
    broken = {**answered, "audit_ok": False, "violations": ["oversold"]}
    unsafe = {**broken, "strategy": "unsafe", "safe": False}
    assert failures([broken, unsafe], [], {"ok": False, "violations": ["x"]}) == [
        "AUDIT FAILED: redis_queue HTTP hot (wrk): ['oversold']",
        "BOOKS FAILED: ['x']",
    ]
