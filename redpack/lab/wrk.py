"""HTTP grab runs from wrk, a C load generator driven by a Lua script (wrk_grab.lua), and the
same runs of the ping (the web ceiling in the hot burst's shape).

Locust spends far more CPU per request than the server it measures does on a grab, and in the hot
burst it also spawns 10,000 users on the machine's own cores; wrk does neither, so its runs show
what the server can do with the generator (almost) out of the way. Its own CPU is measured and a
run it saturated is marked generator-bound, as Locust's are.

- hot burst (`once`): one connection per user, each user grabs once, all at the same time; the
  run ends when every request has its answer (or at `seconds`, the rest unanswered).
- many packets: `connections` keep-alive connections grab back to back for `seconds`, each
  request as the next user.

Every answer is counted by cause (stats.CAUSES) from its status and JSON body; the `grabbed`
answers' amounts come back too, for the auditor's comparison with MySQL. wrk records latency
from a request's write to its answer: in the burst, the TCP connect before it is not included
(the run's `seconds`, from wrk's start to the last answer, is).
"""

import json
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from redpack import webworker
from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail
from redpack.money import to_cents
from strategies import registry

from . import processes
from .stats import (
    ANSWERS,
    CAUSES,
    GENERATOR_BOUND,
    HISTOGRAM_LABELS,
    HISTOGRAM_MS,
    UNANSWERED,
    cause_of,
    run_rates,
    share,
)

SCRIPT = Path(__file__).with_name("wrk_grab.lua")
THREADS = 2
RESULT_PREFIX = "WRK_RESULT "


def available() -> str | None:
    """wrk's path, or None when it is not installed."""
    return shutil.which("wrk")


def grab_run(
    *,
    url: str,
    tokens: list[str],
    once: bool,
    connections: int,
    seconds: int,
    log: Path,
    method: str = "POST",
) -> dict[str, Any]:
    """POST grabs to `url` (the activity's grab path) as the users of `tokens` (Authorization
    values); the summary has the keys of a Locust run's (locustfiles/_common.py) plus
    `granted`: the amounts (decimal strings) of the `grabbed` answers. With `method` GET and
    the ping's url, the same run of the no-op (the web server's ceiling for that shape)."""
    tool = available()
    if tool is None:
        raise RuntimeError("wrk not found (apt-get install wrk)")
    connections = min(connections, webworker.open_files_for(connections))
    if once:
        connections = min(connections, len(tokens))
    with tempfile.TemporaryDirectory(prefix="wrk-") as work:
        users = Path(work) / "tokens"
        users.write_text("".join(f"{token}\n" for token in tokens))
        done_dir = Path(work) / "done"
        done_dir.mkdir()
        path = "/" + url.split("://", 1)[-1].split("/", 1)[1]
        base = url[: len(url) - len(path)]
        env = {
            "WRK_TOKENS": str(users),
            "WRK_PATH": path,
            "WRK_METHOD": method,
            "WRK_THREADS": str(THREADS),
            "WRK_ONCE": "1" if once else "0",
            "WRK_DONE_DIR": str(done_dir),
            "WRK_BOUNDS_MS": ",".join(str(bound) for bound in HISTOGRAM_MS),
        }
        command = [tool, "-t", str(THREADS), "-c", str(connections), "-d", f"{seconds}s"]
        command += ["--timeout", f"{seconds}s", "-s", str(SCRIPT), base]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        with open(log, "w") as handle:
            process = subprocess.Popen(
                command,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            ended = _wait_for_answers(process, done_dir, once=once, seconds=seconds)
            # SIGINT ends wrk's run early (it prints its summary); in a timed run it ends alone.
            if process.poll() is None and once:
                process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=seconds + 120)
            except subprocess.TimeoutExpired:
                processes.kill(process)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        output = log.read_text()
    found = [line for line in output.splitlines() if line.startswith(RESULT_PREFIX)]
    if not found:
        raise RuntimeError(f"wrk exited {process.returncode} without a result; see {log}")
    result = json.loads(found[-1][len(RESULT_PREFIX) :])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    run_seconds = (ended - started) if once else result["duration_us"] / 1e6
    return summarize(
        result,
        sent=len(tokens) if once else None,
        seconds=run_seconds,
        cpu_seconds=cpu,
        connections=connections,
    )


def _wait_for_answers(
    process: subprocess.Popen[str], done_dir: Path, *, once: bool, seconds: int
) -> float:
    """When the burst's last answer came (every thread wrote its marker), or wrk's end."""
    deadline = time.monotonic() + seconds
    while process.poll() is None and time.monotonic() < deadline:
        if once and len(list(done_dir.iterdir())) == THREADS:
            break
        time.sleep(0.02)
    return time.monotonic()


def summarize(
    result: dict[str, Any],
    *,
    sent: int | None,
    seconds: float,
    cpu_seconds: float,
    connections: int,
) -> dict[str, Any]:
    """wrk's result as a lab summary (the keys of a Locust run's). `sent`: the burst's
    requests, one per user; None for a timed run, which goes by the script's count of the
    requests it made: those without an answer were in flight when the clock stopped the run,
    at most one per connection (`cut_off`, on top of `requests`), or lost with a connection
    that broke (the rest: `connection_error`; wrk opens such a connection again and goes on)."""
    causes: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    for key, count in result["answers"].items():
        status, outcome, reason, code = key.split("|")
        statuses[status] += count
        body: dict[str, Any] = {"outcome": outcome, "reason": reason, "error": {"code": code}}
        cause = cause_of(int(status), body, None)
        causes[cause] += count
        if outcome in ANSWERS:
            outcomes[outcome] += count
    answered = sum(causes.values())
    # A request wrk gave up on (--timeout) or whose connection broke has no answer; the burst
    # sent one per user, a timed run the requests the script made, less those cut off.
    causes["client_timeout"] += result["errors"]["timeout"]
    if sent is None:
        without_answer = max(0, result["made"] - answered)
        causes["cut_off"] = min(connections, without_answer)
        sent = answered + without_answer - causes["cut_off"]
    missing = max(0, sent - answered - result["errors"]["timeout"])
    causes["connection_error"] += missing
    at_most = {int(bound): count for bound, count in result["at_most_ms"].items()}
    histogram: dict[str, int] = {}
    below = 0
    for bound, label in zip(HISTOGRAM_MS, HISTOGRAM_LABELS, strict=False):
        within = at_most.get(bound, below)
        histogram[label] = within - below
        below = within
    histogram[HISTOGRAM_LABELS[-1]] = answered - below
    generator_share = round(cpu_seconds / (seconds * THREADS), 3) if seconds else None
    requests_total = sent
    grabbed, contended = outcomes["grabbed"], outcomes["contended"]
    percentiles = {q: value / 1000 for q, value in result["percentiles_us"].items()}
    return {
        "generator": "wrk",
        "connections": connections,
        "requests": requests_total,
        "answered": answered,
        "outcomes": dict(sorted(outcomes.items())),
        "failures": requests_total - answered,
        "interrupted": 0,
        "causes": {c: causes[c] for c in CAUSES if causes[c]},
        "statuses": dict(sorted(statuses.items())),  # HTTP status -> answers
        "unanswered": sum(causes[c] for c in UNANSWERED),
        "unexplained": 0,  # every answer has a cause, every missing one is counted as such
        # Requests wrk sent again after a broken connection, as GET /healthz (wrk_grab.lua).
        "resent": result.get("resent", 0),
        # wrk's own count of what went wrong on its side: sockets that failed to connect, to
        # be read or written (each one a connection it opened again), and status >= 400.
        "generator_errors": dict(result["errors"]),
        "grabbed": grabbed,
        "contended": contended,
        **run_rates(
            requests=requests_total,
            answered=answered,
            grabbed=grabbed,
            contended=contended,
            seconds=seconds,
        ),
        "p50_ms": percentiles.get("50") if answered else None,
        "p95_ms": percentiles.get("95") if answered else None,
        "p99_ms": percentiles.get("99") if answered else None,
        "max_ms": result["max_us"] / 1000 if answered else None,
        "generator_processes": 1,
        "generator_cpu_seconds": round(cpu_seconds, 3),
        "generator_cpu_share": generator_share,
        "generator_bound": generator_share is not None and generator_share >= GENERATOR_BOUND,
        "within_1s": share(at_most.get(1000, 0), requests_total),
        "latency_histogram": {label: n for label, n in histogram.items() if n},
        "granted": result["granted"],
    }


def audit_answers(
    name: str, activity_id: int, granted: list[str], *, cut_off_at_most: int
) -> dict[str, Any]:
    """The auditor on the activity once its grabs settled, and the `grabbed` answers against
    its rows: wrk cannot tell which user an answer went to, so beside the auditor's
    invariants every amount told `grabbed` must be a row's, and the rows nobody heard of
    can only be the requests the run's stop cut off (`cut_off_at_most`: 0 for a burst
    that was answered in full, the connections for a timed run)."""
    started = time.monotonic()
    if cut_off_at_most:
        _wait_for_the_cut_off(activity_id)
    registry.get(name).settle(activity_id=activity_id, timeout=60)
    settle_seconds = time.monotonic() - started
    audit = audit_activity(Activity.objects.get(pk=activity_id))
    violations = list(audit.violations)
    told = Counter(to_cents(amount) for amount in granted)
    rows = Counter(
        to_cents(amount)
        for amount in GrabDetail.objects.filter(activity_id=activity_id).values_list(
            "amount", flat=True
        )
    )
    invented = told - rows
    unheard = rows.total() - told.total() + invented.total()
    if invented:
        violations.append(f"{invented.total()} `grabbed` answers with no row of their amount")
    if unheard > cut_off_at_most:
        violations.append(
            f"{unheard} rows nobody was told `grabbed` of (at most {cut_off_at_most} cut off)"
        )
    return {
        "audit_ok": not violations,
        "oversold": audit.oversold,
        "duplicates": audit.duplicates,
        "violations": violations,
        "interrupted": max(0, unheard),
        "settle_seconds": round(settle_seconds, 3),
    }


QUIET_SECONDS = 1.0  # no new grab row for this long: the server finished what it was doing
QUIET_GIVE_UP_SECONDS = 60.0


def _wait_for_the_cut_off(activity_id: int) -> None:
    """The requests the run's stop cut off are still being answered by the server, which goes on
    writing their grabs: the auditor reads the activity once no new row came for a second (at
    most a minute), or it would see a row without its decrement, or the other way round."""
    give_up = time.monotonic() + QUIET_GIVE_UP_SECONDS
    rows = GrabDetail.objects.filter(activity_id=activity_id)
    seen = rows.count()
    while time.monotonic() < give_up:
        time.sleep(QUIET_SECONDS)
        now = rows.count()
        if now == seen:
            return
        seen = now
