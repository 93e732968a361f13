"""The Locust scenarios: they import, register their options (web UI included), and one real
headless run of `hot` against gunicorn on the test database ends with a passing audit.

Locust monkey-patches the standard library when imported, so it only ever runs in a
subprocess here, never in the test process.
"""

import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.conf import settings

from redpack.lab.stats import cause_of
from redpack.lab.users import (
    bench_authorization,
    bench_sender,
    bench_users_ensure,
    bench_users_write_csv,
)

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ["hot", "throughput", "mixed", "ping"]

INSPECT = """
import importlib.util, json, sys
sys.path.insert(0, "locustfiles")
spec = importlib.util.spec_from_file_location("scenario", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from locust.argument_parser import get_parser, ui_extra_args_dict
parsed = get_parser().parse_args(sys.argv[2:])
print(json.dumps({"web_ui": sorted(ui_extra_args_dict([])), "parsed": vars(parsed)}, default=str))
"""


def inspect(scenario: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", INSPECT, f"locustfiles/{scenario}.py", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_imports_and_registers_its_options(scenario):
    found = inspect(scenario, "--users-csv", "users.csv", "--summary-json", "out.json")

    assert found["parsed"]["users_csv"] == "users.csv"
    assert "users_csv" in found["web_ui"] and "sender_token" in found["web_ui"]
    assert "summary_json" not in found["web_ui"]
    if scenario != "ping":
        assert {"strategy", "allocation", "audit", "settle_timeout"} <= set(found["web_ui"])


def test_hot_options_parse_from_the_command_line():
    found = inspect("hot", "--strategy", "pessimistic", "--packets", "7", "--clicks", "2")

    assert found["parsed"]["strategy"] == "pessimistic"
    assert found["parsed"]["packets"] == 7
    assert found["parsed"]["clicks"] == 2
    assert {"packets", "amount", "activity", "clicks"} <= set(found["web_ui"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def lab_env() -> dict[str, str]:
    """The environment of a server and tools pointed at the test database and Redis."""
    db = settings.DATABASES["default"]
    url = (
        f"mysql://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 3306}/{db['NAME']}"
    )
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": url,
        "SECRET_KEY": settings.SECRET_KEY,
    }


@pytest.fixture
def web(lab_env):  # type: ignore[no-untyped-def]
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "redpack.wsgi:application"]
    command += ["--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "8"]
    server = subprocess.Popen(command, env=lab_env, cwd=REPO, start_new_session=True)
    host = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{host}/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.3)
        yield host
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_headless_hot_run_grabs_every_packet_and_passes_the_audit(web, lab_env, tmp_path):
    ids, _ = bench_users_ensure(count=30, prefix="locust")
    users_csv = tmp_path / "users.csv"
    bench_users_write_csv(user_ids=ids, path=users_csv, ttl=timedelta(hours=1))
    sender = bench_authorization(bench_sender(prefix="locust"), ttl=timedelta(hours=1))
    summary = tmp_path / "summary.json"

    done = subprocess.run(
        [sys.executable, "-m", "locust", "-f", "locustfiles/hot.py", "--headless"]
        + ["-u", "30", "-r", "30", "-t", "90s", "--stop-timeout", "30", "--host", web]
        + ["--users-csv", str(users_csv), "--sender-token", sender, "--only-summary"]
        + ["--strategy", "pessimistic", "--packets", "10", "--summary-json", str(summary)],
        env=lab_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(summary.read_text())
    print({k: v for k, v in figures.items() if k != "answers"})
    assert figures["audit_ok"] is True, figures["violations"]
    assert figures["requests"] == 30 == sum(figures["outcomes"].values())
    assert figures["grabbed"] == figures["grabbed_rows"] == 10
    assert figures["oversold"] == figures["duplicates"] == 0
    assert "grab: grabbed" in done.stderr + done.stdout  # outcomes are Locust's row names
    # Every request has a cause, all of them answers of the contract here.
    assert figures["causes"] == {"grabbed": 10, "sold_out": 20}
    assert figures["unanswered"] == figures["unexplained"] == 0
    assert sum(figures["latency_histogram"].values()) == 30
    # (Locust keeps rounded response times: its percentiles may sit just above the exact max.)
    assert 0 <= figures["within_1s"] <= 1 and figures["max_ms"] > 0
    assert figures["generator_processes"] == 1 and figures["generator_cpu_seconds"] > 0


def test_every_request_gets_a_cause():
    cases = [
        (200, {"outcome": "sold_out"}, None),
        (409, {"outcome": "contended", "reason": "shed"}, None),
        (409, {"outcome": "contended"}, None),
        (429, {"error": {"code": "throttled"}}, None),
        (503, {"error": {"code": "outcome_unknown"}}, None),
        (502, {}, None),
        (404, {"error": {"code": "not_found"}}, None),
        (0, {}, TimeoutError("timed out")),
        (0, {}, ConnectionResetError(104, "Connection reset by peer")),
    ]
    assert [cause_of(*case) for case in cases] == [
        "sold_out",
        "shed",
        "contended",
        "throttled",
        "outcome_unknown",
        "5xx",
        "other_http",
        "client_timeout",
        "connection_error",
    ]


MERGE = """
import locust  # first: it patches the standard library
import json, sys, types
sys.path.insert(0, "locustfiles")
import _common
from locust.env import Environment

environment = Environment()
environment.create_local_runner()
environment.parsed_options = types.SimpleNamespace(strategy="redis_counter")
for ms in (10, 20, 30, 40, 50, 60):
    environment.runner.stats.log_request("POST", "grab", ms, 10)
part = {
    "outcomes": {"grabbed": 4, "sold_out": 1}, "causes": {"grabbed": 4, "sold_out": 1,
    "connection_error": 1}, "answers": {}, "created": [], "failures": 1,
    "interrupted": 3, "first_start": 0.0, "last_end": 10.0, "generator_cpu_seconds": 1.0,
}
out = {}
for burst in (False, True):
    scenario = _common.Scenario("throughput" if not burst else "hot", burst=burst)
    merged = _common._merge(environment, scenario, [dict(part)])
    out[scenario.name] = {k: merged[k] for k in ("requests", "causes", "unanswered", "unexplained")}
print(json.dumps(out))
"""


def test_requests_in_flight_at_the_stop_are_cut_off_in_a_timed_run_unanswered_in_a_burst():
    """Locust's summary of a run (`_merge`): three requests were still in flight when the run
    stopped. A timed run's clock stopped them (`cut_off`, on top of its requests); a burst
    waits for every answer, so there they are unanswered. Neither leaves any unexplained."""
    done = subprocess.run(
        [sys.executable, "-c", MERGE], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["throughput"] == {
        "requests": 6,
        "causes": {"grabbed": 4, "sold_out": 1, "connection_error": 1, "cut_off": 3},
        "unanswered": 1,
        "unexplained": 0,
    }
    assert found["hot"]["causes"] == {"grabbed": 4, "sold_out": 1, "connection_error": 1}
    assert found["hot"]["unanswered"] == 1 + 3
