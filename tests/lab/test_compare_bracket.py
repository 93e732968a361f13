"""The pings on either side of a run: a many-packets run's share of them (compare.ping_bracket),
a hot burst's budget from the ping bursts (compare.burst_bracket)."""

from redpack.lab.compare import Beside, burst_bracket, ping_bracket


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
