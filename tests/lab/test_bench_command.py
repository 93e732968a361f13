"""`manage.py bench` on the real MariaDB/Redis with spawned processes; figures are printed."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

REQUIRED = {
    "strategy",
    "packets",
    "users",
    "concurrency",
    "requests",
    "grabbed",
    "seconds",
    "requests_per_s",
    "grabs_per_s",
    "success_rate",
    "contended",
    "oversold",
    "duplicates",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "mysql_queries_per_request",
    "redis_commands_per_request",
    "cpu_seconds",
    "audit_ok",
}


def bench(**options: object) -> dict:
    out = io.StringIO()
    call_command("bench", json=True, stdout=out, **options)
    figures = json.loads(out.getvalue())
    print(json.dumps({k: figures[k] for k in sorted(REQUIRED | {"outcomes", "violations"})}))
    return figures


@pytest.mark.django_db(transaction=True)
def test_small_pessimistic_run_prints_every_figure_and_passes_the_audit():
    figures = bench(strategy="pessimistic", packets=20, users=60)

    assert figures.keys() >= REQUIRED
    assert figures["audit_ok"] is True, figures["violations"]
    assert figures["grabbed"] == figures["grabbed_rows"] == 20
    assert figures["requests"] == 60 == sum(figures["outcomes"].values())
    assert figures["oversold"] == figures["duplicates"] == figures["errors"] == 0
    assert figures["p50_ms"] <= figures["p95_ms"] <= figures["p99_ms"]
    assert figures["mysql_queries_per_request_own"] > 0  # pessimistic lives in MySQL


@pytest.mark.django_db(transaction=True)
def test_double_clicks_get_one_packet_per_user():
    figures = bench(strategy="pessimistic", packets=10, users=15, clicks=2, concurrency=8)

    assert figures["audit_ok"] is True, figures["violations"]
    assert figures["requests"] == 30
    assert figures["grabbed"] == 10
    assert figures["duplicates"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_failed_audit_exits_non_zero_after_printing_the_figures(settings):
    settings.REDPACK_STRATEGIES = {
        **settings.REDPACK_STRATEGIES,
        "overselling": "tests.lab.overselling.OversellingStrategy",
    }
    out = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command(
            "bench",
            strategy="overselling",
            packets=5,
            users=12,
            concurrency=4,
            json=True,
            stdout=out,
        )

    assert exit_info.value.code == 1
    figures = json.loads(out.getvalue())
    assert figures["safe"] is False  # refused by default, allowed by the bench for itself
    assert figures["audit_ok"] is False
    assert figures["oversold"] >= 12 - 5  # at least the grabs beyond the 5 packets


def test_an_unknown_strategy_is_a_command_error():
    with pytest.raises(CommandError, match="unknown strategy"):
        call_command("bench", strategy="no-such-strategy")
