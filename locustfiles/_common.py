"""What the scenarios share: options, bench tokens, the activity under test, outcomes, audit.

Locust skips files whose name starts with "_", so `locust -f locustfiles/` never runs this as
a scenario. No Django here: the scenarios talk HTTP only, and the local audit runs
`manage.py audit` as a subprocess. Figures use the lab's one definition of each
(redpack/lab/stats.py, plain Python), as the direct bench does.

Strategies: `--strategy` offers the ones the server allows (GET /api/strategies/, asked again
each time the web UI's page loads), and a run on any other is refused before a request is sent:
by argparse on the command line, by the web UI's /swarm, and at test start. The web UI's "Audit"
tab shows the run's outcomes (the `contended` share among them) and the auditor's verdict; the
summary with the audit downloads as JSON (Download Data).

Counting: a grab answered 200 (grabbed, already_grabbed, sold_out, closed) or 409 (contended)
is a *success* for Locust, reported under `grab: <outcome>`; contended is counted and shown
on its own row but is not a failure, because it is a valid answer of the contract ("nothing
this time, retry"). Failures are transport errors, timeouts, 5xx and unexpected answers.
"""

import base64
import csv
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import requests
from locust import events
from locust.env import Environment
from locust.runners import (
    STATE_RUNNING,
    STATE_SPAWNING,
    WORKER_REPORT_INTERVAL,
    MasterRunner,
    WorkerRunner,
)
from locust.stats import StatsEntry

from redpack.lab.stats import (
    ANSWERS,
    CAUSES,
    GENERATOR_BOUND,
    UNANSWERED,
    cause_of,
    histogram_of_counts,
    percentile_of_counts,
    run_rates,
    share,
)

logger = logging.getLogger("redpack.locust")

REPO = Path(__file__).resolve().parent.parent
MANAGE_PY = REPO / "manage.py"
OUTCOMES = ANSWERS
SUMMARY_MESSAGE = "redpack_summary"  # worker -> master: its counts, once stopped
DONE_MESSAGE = "redpack_done"  # worker -> master: all its users are done
STOP_MESSAGE = "redpack_stop"  # master -> workers: stop and report now


@dataclass
class Identity:
    user_id: int
    authorization: str


def user_id_of(authorization: str) -> int:
    """The `user_id` claim of a bench token (read, not verified: the server verifies)."""
    payload = authorization.split()[-1].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return int(claims["user_id"])


def to_cents(amount: str) -> int:
    return int(Decimal(amount) * 100)


def load_identities(path: str) -> list[Identity]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [Identity(user_id_of(r["authorization"]), r["authorization"]) for r in rows]


@dataclass
class Lab:
    """One Locust process's view of the run; workers send theirs to the master at the end."""

    activity_id: int | None = None
    identities: list[Identity] = field(default_factory=list)
    next_identity: int = 0
    sender: Identity | None = None
    created: list[int] = field(default_factory=list)  # activities sent during the run
    answers: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    causes: Counter[str] = field(default_factory=Counter)  # every grab request, by cause
    failures: int = 0
    in_flight: int = 0  # at the end: grabs cut off by the stop, answered to nobody
    first_start: float | None = None
    last_end: float | None = None
    finished_users: int = 0
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)  # by worker (master)
    cpu_at_start: float = 0.0  # this process's CPU seconds when the test started
    workers_done: int = 0
    finishing: bool = False
    waited_for_persistence: bool = False
    summary: dict[str, Any] | None = None  # the run's summary and audit, once it stopped
    gate: gevent.event.Event = field(default_factory=gevent.event.Event)  # all users spawned
    # test_stop can fire twice (the run-time limit racing the last user), and a second quit
    # ends the process: the first test_stop audits, `quitting` waits for it.
    stopping: bool = False
    audited: gevent.event.Event = field(default_factory=gevent.event.Event)

    def reset(self) -> None:
        self.__dict__.update(Lab().__dict__)

    def take_identity(self) -> Identity | None:
        """The next unused bench user of this process (greenlets switch only on I/O)."""
        if self.next_identity >= len(self.identities):
            return None
        identity = self.identities[self.next_identity]
        self.next_identity += 1
        return identity

    def local_summary(self) -> dict[str, Any]:
        return {
            "answers": {str(k): v for k, v in self.answers.items()},
            "created": self.created,
            "outcomes": dict(self.outcomes),
            "causes": dict(self.causes),
            "failures": self.failures,
            "interrupted": self.in_flight,
            "first_start": self.first_start,
            "last_end": self.last_end,
            "generator_cpu_seconds": round(cpu_seconds() - self.cpu_at_start, 3),
        }


lab = Lab()


@dataclass(frozen=True)
class Scenario:
    name: str
    creates_activity: bool = True
    packets: int = 100
    # Each user's clicks once, the run over when all are answered (or at its cap): a request
    # still in flight at the stop is unanswered. Else the run is timed, and such a request is
    # `cut_off` by its clock (stats.CAUSES).
    burst: bool = False


STRATEGIES_TIMEOUT = 3.0  # seconds to wait for the server's /api/strategies/
DEFAULT_STRATEGY = "pessimistic"
known_strategies: list[str] = []  # the server's allowed strategies, as last seen


def server_strategies(host: str, authorization: str) -> list[str] | None:
    """The strategies the server at `host` allows (remembered in known_strategies); None when
    it does not say."""
    if not host:
        return None
    try:
        response = requests.get(
            f"{host.rstrip('/')}/api/strategies/",
            headers={"Authorization": authorization},
            timeout=STRATEGIES_TIMEOUT,
        )
        rows = response.json() if response.status_code == 200 else None
    except (requests.RequestException, ValueError):
        rows = None
    if not isinstance(rows, list):
        return None
    known_strategies[:] = [row["name"] for row in rows if row.get("allowed")]
    return list(known_strategies)


def first_authorization(options: Any) -> str:
    """The sender's token, else the first bench user's: who asks the server for its strategies."""
    if getattr(options, "sender_token", ""):
        return str(options.sender_token)
    try:
        with open(options.users_csv, newline="") as handle:
            return next(csv.DictReader(handle))["authorization"]
    except (OSError, StopIteration, KeyError):
        return ""


def refusal(strategy: str, host: str, authorization: str) -> str | None:
    """Why a run on `strategy` must not start (asked of the server now), or None."""
    allowed = server_strategies(host, authorization)
    if allowed is None:
        return f"the server at {host or '(no host)'} does not list its strategies"
    if strategy not in allowed:
        return f"strategy {strategy!r} is not available on {host}: use {', '.join(allowed)}"
    return None


def add_arguments(parser: Any, scenario: Scenario) -> None:
    # Straight on the parser: argument groups do not take include_in_web_ui / is_secret.
    parser.add_argument(
        "--users-csv",
        default=os.environ.get("REDPACK_USERS_CSV", "bench-users.csv"),
        help="CSV from `manage.py create_bench_users` (username,authorization).",
    )
    parser.add_argument(
        "--sender-token",
        default="",
        is_secret=True,
        help="Authorization header of the user that sends the activity (default: first CSV row).",
    )
    parser.add_argument(
        "--summary-json",
        default="",
        include_in_web_ui=False,
        help="Write the run's summary (outcomes, rates, audit) to this file.",
    )
    if scenario.name == "ping":
        return
    strategy = parser.add_argument(
        "--strategy",
        default=DEFAULT_STRATEGY,
        help="Grab strategy of the activity: one the server allows (/api/strategies/).",
    )
    # The server's list as the choices (the web UI shows a dropdown): asked with the host and
    # token the command line gives; when the server does not answer yet, the last list seen.
    known, _ = parser.parse_known_args()
    allowed = server_strategies(known.host or "", first_authorization(known)) or known_strategies
    if allowed:
        strategy.choices = list(allowed)
        strategy.default = DEFAULT_STRATEGY if DEFAULT_STRATEGY in allowed else allowed[0]
    parser.add_argument(
        "--allocation",
        default="double_average",
        choices=["double_average", "line_segment", "equal"],
    )
    parser.add_argument("--settle-timeout", type=float, default=30.0, help="Wait for persistence.")
    parser.add_argument(
        "--audit",
        default="auto",
        choices=["auto", "http", "off"],
        help="auto: API check plus `manage.py audit` when manage.py is next to locustfiles/; "
        "http: API check only.",
    )
    if scenario.creates_activity:
        parser.add_argument("--packets", type=int, default=scenario.packets, help="Packets.")
        parser.add_argument(
            "--amount", default="", help="Total amount, e.g. 100.00 (default: 1.00 per packet)."
        )
        parser.add_argument(
            "--activity", type=int, default=0, help="Grab this existing activity (0: send one)."
        )
    if scenario.name == "hot":
        parser.add_argument("--clicks", type=int, default=1, help="Grabs per user, at once.")


def register(scenario: Scenario) -> None:
    """Hook the scenario into Locust's events; call once from the scenario module."""

    @events.init_command_line_parser.add_listener
    def _(parser: Any) -> None:
        add_arguments(parser, scenario)

    @events.init.add_listener
    def _(environment: Environment, **kwargs: Any) -> None:
        runner = environment.runner
        if environment.web_ui is not None and scenario.name != "ping":
            extend_web_ui(environment)
        if isinstance(runner, MasterRunner):
            runner.register_message(SUMMARY_MESSAGE, _on_worker_summary)
            runner.register_message(DONE_MESSAGE, lambda msg, **kw: _on_worker_done(environment))
        elif isinstance(runner, WorkerRunner):
            # Stopping fires test_stop, which sends this worker's summary.
            runner.register_message(STOP_MESSAGE, lambda msg, **kw: runner.stop())

    @events.test_start.add_listener
    def _(environment: Environment, **kwargs: Any) -> None:
        _start(environment, scenario)

    @events.spawning_complete.add_listener
    def _(user_count: int, **kwargs: Any) -> None:
        # The generator's CPU is counted from here, as the requests are (spawning thousands of
        # users costs CPU before the first request).
        lab.cpu_at_start = cpu_seconds()
        lab.gate.set()

    @events.test_stop.add_listener
    def _(environment: Environment, **kwargs: Any) -> None:
        if lab.stopping:
            return
        lab.stopping = True
        try:
            _stop(environment, scenario)
        finally:
            lab.audited.set()

    @events.quitting.add_listener
    def _(environment: Environment, **kwargs: Any) -> None:
        if lab.stopping:
            lab.audited.wait(timeout=900)


AUDIT_TAB = "audit"


def extend_web_ui(environment: Environment) -> None:
    """/swarm refuses a strategy the server does not allow; an "Audit" tab; the summary as JSON."""
    web_ui = environment.web_ui
    assert web_ui is not None
    from flask import Response, jsonify, request

    @web_ui.app.before_request
    def refuse_unknown_strategy() -> Any:
        if request.method != "POST" or not request.path.endswith("/swarm"):
            return None
        options = environment.parsed_options
        host = request.form.get("host") or environment.host or ""
        problem = refusal(
            request.form.get("strategy", getattr(options, "strategy", "")),
            host,
            first_authorization(options),
        )
        if problem is None:
            return None
        logger.error("run refused: %s", problem)
        return jsonify({"success": False, "message": f"Not started: {problem}", "host": host})

    @web_ui.app.after_request
    def add_audit(response: Any) -> Any:
        if request.path.endswith("/stats/requests") and response.is_json:
            body = response.get_json()
            body["extended_stats"] = [{"key": AUDIT_TAB, "data": audit_rows(environment)}]
            if auditing():
                # The audit runs once the runner says stopped, and the page stops asking for
                # stats when it sees stopped: until the verdict is in, it keeps asking.
                body["state"] = STATE_RUNNING
            response.set_data(json.dumps(body))
        return response

    @web_ui.app.route("/redpack/summary.json")
    def summary_json() -> Any:
        if lab.summary is None:
            return Response("no run has finished yet", status=404, mimetype="text/plain")
        return Response(
            json.dumps(lab.summary, indent=2),
            mimetype="application/json",
            headers={"Content-Disposition": "attachment; filename=redpack-summary.json"},
        )

    web_ui.template_args.update(
        extended_tabs=[{"title": "Audit", "key": AUDIT_TAB}],
        extended_tables=[
            {
                "key": AUDIT_TAB,
                "structure": [
                    {"key": "item", "title": "Audit"},
                    {"key": "value", "title": "Result"},
                ],
            }
        ],
        extended_csv_files=[
            {"href": "./redpack/summary.json", "title": "The run's summary and audit (JSON)"}
        ],
    )


def auditing() -> bool:
    return lab.stopping and not lab.audited.is_set()


def audit_rows(environment: Environment) -> list[dict[str, str]]:
    """The Audit tab: the verdict, then every outcome with its share of the requests."""
    summary = lab.summary
    if summary is None:
        running = environment.runner is not None and environment.runner.state in (
            STATE_SPAWNING,
            STATE_RUNNING,
        )
        verdict = (
            "auditing…"
            if auditing()
            else "running: audited when the test stops"
            if running
            else "no run yet"
        )
        outcomes, requests_total = dict(lab.outcomes), sum(lab.outcomes.values()) + lab.failures
        rows = [{"item": "verdict", "value": verdict}]
    else:
        outcomes, requests_total = summary.get("outcomes", {}), summary.get("requests") or 0
        violations = summary.get("violations") or []
        if summary.get("audit_ok"):
            verdict = "clean: no oversell, no duplicate, every `grabbed` answer recorded"
        elif summary.get("audit_ok") is None and not violations:
            verdict = "not audited (--audit off)"
        else:
            verdict = f"VIOLATED: {len(violations)} violations"
        rows = [
            {"item": "verdict", "value": verdict},
            {"item": "strategy", "value": str(summary.get("strategy"))},
            {"item": "activities", "value": ", ".join(map(str, summary.get("activities", [])))},
            {"item": "requests", "value": f"{requests_total:,}"},
        ]
        rows += [{"item": "violation", "value": v} for v in violations]
    for outcome in OUTCOMES:
        count = outcomes.get(outcome, 0)
        rows.append({"item": outcome, "value": f"{count:,} ({percent(count, requests_total)})"})
    if summary is not None:
        rows += [
            {"item": "failures", "value": f"{summary.get('failures', 0):,}"},
            {"item": "unanswered", "value": f"{summary.get('unanswered', 0):,}"},
            {"item": "oversold", "value": str(summary.get("oversold"))},
            {"item": "duplicates", "value": str(summary.get("duplicates"))},
        ]
    return rows


def percent(count: int, total: int) -> str:
    value = share(count, total)
    return "–" if value is None else f"{100 * value:.1f}%"


def cpu_seconds() -> float:
    """This Locust process's own CPU time (user + system): the load generator's cost."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _start(environment: Environment, scenario: Scenario) -> None:
    lab.reset()
    options = environment.parsed_options
    runner = environment.runner
    identities = load_identities(options.users_csv)
    sender = (
        Identity(user_id_of(options.sender_token), options.sender_token)
        if options.sender_token
        else identities[0]
    )
    grabbers = [i for i in identities if i.user_id != sender.user_id]
    if isinstance(runner, WorkerRunner):
        # Each worker takes its own slice of the bench users: nobody grabs twice by accident.
        workers = max(1, int(getattr(options, "redpack_workers", 1)))
        grabbers = grabbers[runner.worker_index % workers :: workers]
    lab.sender, lab.identities = sender, grabbers
    if isinstance(runner, WorkerRunner):
        lab.activity_id = getattr(options, "redpack_activity_id", None)
        return
    problem = scenario.name != "ping" and refusal(
        options.strategy, environment.host or "", sender.authorization
    )
    if problem:  # the web UI and argparse refuse first; this is the last line
        logger.error("run refused: %s", problem)
        environment.process_exit_code = 2
        gevent.spawn(runner.quit if options.headless else runner.stop)
        return
    # Custom attributes of parsed_options travel to the workers with the spawn message.
    if isinstance(runner, MasterRunner):
        options.redpack_workers = runner.worker_count
    if scenario.creates_activity:
        lab.activity_id = options.activity or _send_activity(environment, sender)
        options.redpack_activity_id = lab.activity_id
        logger.info("grabbing activity %s (%s)", lab.activity_id, options.strategy)


def _send_activity(environment: Environment, sender: Identity) -> int:
    options = environment.parsed_options
    amount = options.amount or f"{options.packets}.00"
    body = {
        "total_amount": amount,
        "total_count": options.packets,
        "strategy": options.strategy,
        "allocation": options.allocation,
        "expires_in": 24 * 3600,
    }
    response = requests.post(
        f"{environment.host}/api/activities/",
        json=body,
        headers={"Authorization": sender.authorization},
        timeout=300,
    )
    if response.status_code != 201:
        raise RuntimeError(f"cannot send the activity: {response.status_code} {response.text}")
    return int(response.json()["id"])


def grab(user: Any, identity: Identity, activity_id: int) -> str | None:
    """One grab click; returns the outcome, or None when the request failed. Every request
    is counted under its cause (CAUSES), answered or not."""
    began = time.time()
    lab.first_start = began if lab.first_start is None else min(lab.first_start, began)
    outcome = None
    lab.in_flight += 1
    with user.client.post(
        f"/api/activities/{activity_id}/grab/",
        headers={"Authorization": identity.authorization},
        name="grab",
        catch_response=True,
    ) as response:
        body: dict[str, Any] = {}
        if response.status_code in (200, 409, 429, 503):
            try:
                body = response.json()
            except ValueError:
                body = {}
        answered = body.get("outcome")
        if answered in OUTCOMES and (response.status_code == 409) == (answered == "contended"):
            outcome = answered
            response.request_meta["name"] = f"grab: {outcome}"
            response.success()
        else:
            response.failure(f"HTTP {response.status_code}: {(response.text or '')[:120]}")
        lab.causes[cause_of(response.status_code, body, getattr(response, "error", None))] += 1
    lab.in_flight -= 1
    lab.last_end = time.time()
    if outcome is None:
        lab.failures += 1
        return None
    lab.outcomes[outcome] += 1
    if outcome == "grabbed":
        lab.answers.setdefault(activity_id, []).append((identity.user_id, to_cents(body["amount"])))
    return outcome


def user_finished(environment: Environment) -> None:
    """A user is done for good; once every user is, stop the test instead of idling."""
    lab.finished_users += 1
    runner = environment.runner
    if lab.finished_users < runner.target_user_count:
        return
    if isinstance(runner, WorkerRunner):
        runner.send_message(DONE_MESSAGE, None)
    else:
        _finish(environment)


def _on_worker_done(environment: Environment) -> None:
    lab.workers_done += 1
    if lab.workers_done >= environment.runner.worker_count:
        _finish(environment)


def _finish(environment: Environment) -> None:
    runner = environment.runner
    if lab.finishing or runner.state not in (STATE_SPAWNING, STATE_RUNNING):
        return
    lab.finishing = True
    # Headless: end the process (test_stop audits first). Web UI: stop and keep the UI up.
    gevent.spawn(runner.quit if environment.parsed_options.headless else runner.stop)


def _on_worker_summary(msg: Any, **kwargs: Any) -> None:
    lab.summaries[msg.node_id] = msg.data


def _stop(environment: Environment, scenario: Scenario) -> None:
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        runner.send_message(SUMMARY_MESSAGE, lab.local_summary())
        return
    parts = [lab.local_summary()]
    if isinstance(runner, MasterRunner):
        # On quit (e.g. the --run-time limit) the master stops before its workers do.
        if len(lab.summaries) < runner.worker_count:
            runner.send_message(STOP_MESSAGE)
        deadline = time.monotonic() + 15
        while len(lab.summaries) < runner.worker_count and time.monotonic() < deadline:
            gevent.sleep(0.2)
        gevent.sleep(WORKER_REPORT_INTERVAL + 0.5)  # the workers' last stats report
        parts = list(lab.summaries.values())
    summary = _merge(environment, scenario, parts)
    if scenario.creates_activity and not lab.activity_id:
        summary["violations"] = ["the test stopped before an activity was sent"]
    elif scenario.name != "ping":
        _audit(environment, summary)
        if summary["unexplained"]:
            # A request with no answer and no reason recorded: the run cannot be trusted.
            summary["violations"].append(
                f"{summary['unexplained']} requests ended without a recorded cause"
            )
            summary["audit_ok"] = False
    path = getattr(environment.parsed_options, "summary_json", "")
    lab.summary = summary
    if path:
        Path(path).write_text(json.dumps(summary, indent=2))
    logger.info(
        "redpack summary: %s", json.dumps({k: v for k, v in summary.items() if k != "answers"})
    )
    if summary.get("violations"):
        environment.process_exit_code = 1


def _merge(environment: Environment, scenario: Scenario, parts: list[dict]) -> dict[str, Any]:
    options = environment.parsed_options
    outcomes: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    answers: dict[str, list] = {}
    created: list[int] = []
    for part in parts:
        outcomes.update(part["outcomes"])
        causes.update(part.get("causes", {}))
        for activity, told in part["answers"].items():
            answers.setdefault(activity, []).extend(told)
        created.extend(part["created"])
    failures = sum(p["failures"] for p in parts)
    interrupted = sum(p.get("interrupted", 0) for p in parts)
    starts = [p["first_start"] for p in parts if p["first_start"] is not None]
    ends = [p["last_end"] for p in parts if p["last_end"] is not None]
    seconds = max(ends) - min(starts) if starts else 0.0
    # Each Locust process runs on one core at most (gevent, one thread): a generator near a
    # full core per process may be what limits the run, not the server.
    generator_cpu = sum(p.get("generator_cpu_seconds", 0.0) for p in parts)
    generator_share = round(generator_cpu / (seconds * len(parts)), 3) if seconds else None
    latency = _grab_latency(environment, "ping" if scenario.name == "ping" else "grab")
    requests_total = latency.num_requests
    # Requests Locust counted without a cause of ours (the ones in flight at the stop it never
    # counted).
    unexplained = max(0, requests_total - sum(causes.values())) if scenario.name != "ping" else 0
    if interrupted and not scenario.burst:
        causes["cut_off"] += interrupted
    answered = sum(outcomes.values())
    grabbed = outcomes["grabbed"]
    contended = outcomes["contended"]
    return {
        "scenario": scenario.name,
        "strategy": getattr(options, "strategy", None),
        "activity_id": lab.activity_id,
        "activities": ([lab.activity_id] if lab.activity_id else []) + created,
        "locust_users": environment.runner.target_user_count,
        "requests": requests_total,
        "answered": answered,
        "outcomes": dict(sorted(outcomes.items())),
        "failures": failures if scenario.name != "ping" else latency.num_failures,
        "interrupted": interrupted,
        # Every request by cause; `unanswered`: no HTTP answer reached the client (timeout,
        # connection error, a burst's request still in flight at its cap); `unexplained`:
        # requests Locust counted without a cause of ours (must be 0, else the run is marked
        # failed).
        "causes": {c: causes[c] for c in CAUSES if causes[c]},
        "unanswered": sum(causes[c] for c in UNANSWERED) + (interrupted if scenario.burst else 0),
        "unexplained": unexplained,
        "grabbed": grabbed,
        "contended": contended,
        **run_rates(
            requests=requests_total,
            answered=answered,
            grabbed=grabbed,
            contended=contended,
            seconds=seconds,
        ),
        "p50_ms": _percentile(latency, 0.50),
        "p95_ms": _percentile(latency, 0.95),
        "p99_ms": _percentile(latency, 0.99),
        "max_ms": latency.max_response_time if latency.num_requests else None,
        "generator_processes": len(parts),
        "generator_cpu_seconds": round(generator_cpu, 3),
        "generator_cpu_share": generator_share,
        "generator_bound": generator_share is not None and generator_share >= GENERATOR_BOUND,
        "within_1s": within(latency, 1000),
        "latency_histogram": histogram_of_counts(latency.response_times),
        "answers": answers,
    }


def _grab_latency(environment: Environment, prefix: str) -> StatsEntry:
    """All requests named `<prefix>` or `<prefix>: …`, whatever their outcome, as one entry."""
    stats = environment.runner.stats
    merged = StatsEntry(stats, prefix, "", use_response_times_cache=False)
    for entry in stats.entries.values():
        if entry.name == prefix or entry.name.startswith(f"{prefix}: "):
            merged.extend(entry)
    return merged


def within(entry: StatsEntry, ms: int) -> float | None:
    """Share of the requests answered within `ms` (failures count, at the time they failed)."""
    if not entry.num_requests:
        return None
    return round(sum(c for t, c in entry.response_times.items() if t <= ms) / entry.num_requests, 4)


def _percentile(entry: StatsEntry, q: float) -> float | None:
    """Locust keeps response times as a histogram; the lab's nearest-rank percentile of it."""
    return percentile_of_counts(entry.response_times, q)


def _audit(environment: Environment, summary: dict[str, Any]) -> None:
    """The API's view of every activity of the run, then `manage.py audit` when local."""
    options = environment.parsed_options
    violations: list[str] = []
    summary.update(audit=options.audit, audit_ok=None, oversold=None, duplicates=None)
    if options.audit == "off" or not summary["activities"]:
        summary["violations"] = violations
        return
    started = time.monotonic()
    lagged = False
    oversold = 0
    for activity_id in summary["activities"]:
        told = len(summary["answers"].get(str(activity_id), []))
        state = _settled_state(environment, activity_id, told, options.settle_timeout)
        lagged = lagged or lab.waited_for_persistence
        if state is None:
            violations.append(f"activity {activity_id}: the API did not answer")
            continue
        grabbed, remaining, total = (
            state["grabbed_count"],
            state["remaining_count"],
            state["total_count"],
        )
        oversold += max(0, grabbed - total)
        if grabbed > total or remaining < 0:
            violations.append(f"activity {activity_id}: {grabbed} grabbed of {total} (oversold)")
        if grabbed != told and _all_answers_seen(summary):
            violations.append(f"activity {activity_id}: {told} told `grabbed`, {grabbed} recorded")
    # Persist lag: how long MySQL took to show every `grabbed` answer; 0 when the first look
    # already did (the look itself is not lag).
    summary["settle_seconds"] = round(time.monotonic() - started, 3) if lagged else 0.0
    summary["oversold"] = oversold
    if options.audit == "auto" and MANAGE_PY.exists():
        violations.extend(_local_audit(summary))
    summary["violations"] = violations
    summary["audit_ok"] = not violations


def _settled_state(
    environment: Environment, activity_id: int, told: int, timeout: float
) -> dict[str, Any] | None:
    """The activity once the API shows as many grabs as clients were told (or at timeout)."""
    deadline = time.monotonic() + timeout
    state = None
    lab.waited_for_persistence = False
    while True:
        try:
            response = requests.get(
                f"{environment.host}/api/activities/{activity_id}/",
                headers={"Authorization": lab.sender.authorization if lab.sender else ""},
                timeout=30,
            )
            if response.status_code == 200:
                state = response.json()
        except requests.RequestException as exc:
            logger.warning("activity %s: %s", activity_id, exc)
        if state is not None and state["grabbed_count"] >= told:
            return state
        if time.monotonic() > deadline:
            return state
        lab.waited_for_persistence = True
        gevent.sleep(0.5)


def _all_answers_seen(summary: dict[str, Any]) -> bool:
    """False when some grab requests failed or were cut off: the server may have granted
    packets whose answers no client saw, so only the row-level invariants can be checked."""
    return not summary["failures"] and not summary["interrupted"]


def _local_audit(summary: dict[str, Any]) -> list[str]:
    """`manage.py audit` over the run's activities, with the `grabbed` answers when complete."""
    command = [sys.executable, str(MANAGE_PY), "audit", "--json"]
    for activity_id in summary["activities"]:
        command += ["--activity", str(activity_id)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(summary["answers"], handle)
    if _all_answers_seen(summary):
        command += ["--answers", handle.name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    finally:
        os.unlink(handle.name)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [f"manage.py audit failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"]
    summary["oversold"] = max(
        summary["oversold"] or 0, sum(r["oversold"] for r in result["reports"])
    )
    summary["duplicates"] = sum(r["duplicates"] for r in result["reports"])
    summary["grabbed_rows"] = sum(r["grabbed"] for r in result["reports"])
    return [f"activity {r['activity']}: {v}" for r in result["reports"] for v in r["violations"]]
