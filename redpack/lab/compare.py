"""`manage.py compare`: every strategy through the direct bench and Locust, next to the ceilings.

It measures the storage ceilings, starts a Celery worker and one beat when the project defines
tasks, runs every strategy (the unsafe baseline included when registered) through the direct
bench (`bench hot`, `bench throughput`, `bench lone`), then starts gunicorn, measures the web
ceilings and runs every strategy over HTTP (`HTTP throughput`, `HTTP hot`, from Locust and from
wrk), stops what it started, and writes reports/compare.{md,png,json} (and its logs under
reports/logs/); nothing outside reports/.
"""

import csv
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import requests
from django.conf import settings
from django.db import connection
from django.test.utils import override_settings
from redis.exceptions import RedisError

from redpack import ledger, services, webworker
from redpack.audit import audit_books
from redpack.checks import mysql_room
from strategies import registry

from . import ceilings as ceiling_runs
from . import processes, report, wrk
from .bench import DEFAULT_PROCESSES
from .ceilings import Ceiling
from .meters import Meters, Usage, machine_shares, machine_times
from .users import bench_authorization, bench_sender, bench_users_ensure, bench_users_write_csv

BASE_DIR: Path = settings.BASE_DIR
RAW_CONCURRENCY = 16  # connections of the raw grab transactions (a web tier's pool, roughly)
# Connections a bench needs beyond its threads' (its parent's; the Celery worker's may grow).
BENCH_CONNECTIONS_SPARE = 4
# Longest wait for the server to close a burst's connections: a silent one lives the deferred
# accept (15 s for REDPACK_WEB_READ_TIMEOUT's 10) plus REDPACK_WEB_FIRST_BYTE_TIMEOUT (60 s;
# the server reads the same environment), with a margin.
QUIET_TIMEOUT_SECONDS = (webworker.FIRST_BYTE_TIMEOUT or 60.0) + 30.0
CREDIT_DEFERRED_SECONDS = 7 * 24 * 3600  # the lab's beat never starts crediting during a run


@dataclass
class CompareConfig:
    strategies: list[str] = field(default_factory=list)  # empty: every registered strategy
    concurrency: int = 64
    # The bench's grabs in flight for a strategy that combines them (GrabStrategy.batched): a
    # process's batch holds about half its threads (the other half gathers meanwhile), so at
    # 64 over two processes a batch is 16 grabs, half the raw batched ceiling's 32; at 128 it
    # is 32, the ceiling's own size. A bench thread holds a MySQL connection: 128 of
    # MariaDB's default 151, which is why every bench runs before the first HTTP run (the web
    # server's threads keep theirs).
    batched_concurrency: int = 128
    bench_processes: int = DEFAULT_PROCESSES  # one per core (bench.py)
    hot_users: int = 10_000
    hot_packets: int = 100
    throughput_packets: int = 100_000
    throughput_users: int = 5_000  # grabs fired by the bench's throughput runs (one per user)
    # Distinct users of the HTTP throughput runs: more than such a run sends on this kind of
    # machine (about 3,000 requests/s for 15 s), so that every request is a user's first grab.
    http_users: int = 60_000
    hot_seconds: int = 60  # cap for Locust hot; it ends when every user has grabbed
    throughput_seconds: int = 15
    lone_grabs: int = 300  # `bench lone`: one grab at a time (no contention), for its latency
    web_seconds: int = 10
    # wrk's many-packets run and hot burst of each strategy, each with its pings beside it, this
    # many times; the report keeps the median round's figures (`median_round`).
    rounds: int = 1
    ceiling_requests: int = 100_000  # redis-benchmark EVALSHA calls
    ceiling_queries: int = 20_000  # hot-row UPDATEs
    seed_ceiling_grabs: int = 4_000  # grabs of each seed's raw same-SQL ceiling
    web_workers: int = 2
    web_threads: int = 32
    port: int = 8765
    celery: str = "auto"  # auto: when the project defines Celery tasks; on; off
    skip_bench: bool = False
    skip_locust: bool = False  # Locust's runs and ping (wrk's still run where wrk is installed)
    skip_http: bool = False  # no web server: neither Locust's runs nor wrk's
    out_dir: Path = BASE_DIR / "reports"
    work_dir: Path = BASE_DIR / "reports" / "logs"
    command: str = "manage.py compare"

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be 1 or more, not {self.rounds}")


def bench_concurrency(config: CompareConfig, name: str) -> int:
    """The grabs in flight of a strategy's hot and throughput bench runs."""
    return config.batched_concurrency if registry.get(name).batched else config.concurrency


def backlog_before() -> str | None:
    """Work older than the run that background tasks would do during it, sharing the machine
    with the runs and lowering their figures: grabs of a write-behind strategy still on their
    way to MySQL (failed writes retried among them); None when there is none."""
    try:
        _, sections = registry.health()
    except RedisError as exc:
        return f"the persist backlog could not be read ({exc})"
    persist = sections.get("persist")
    waiting = int(persist.get("pending", 0)) if isinstance(persist, dict) else 0
    return f"{waiting} grabs waited to persist" if waiting else None


def celery_tasks() -> list[str]:
    """The project's own Celery tasks; a Celery worker and beat run only when there are some."""
    from redpack.celery import app

    app.loader.import_default_modules()
    return sorted(name for name in app.tasks if not name.startswith("celery."))


def storage_bound(rows: list[dict[str, Any]]) -> str:
    """ "mysql" when a grab costs at least one MySQL statement, else "redis". Judged on the
    throughput runs when there are some: every request there is a real grab, while most of a
    hot run's are answered from memory once sold out (redpack/finished.py)."""
    grabbing = [r for r in rows if "throughput" in str(r.get("run", ""))] or rows
    for key in ("mysql_queries_per_request_own", "mysql_queries_per_request"):
        values = [r[key] for r in grabbing if r.get(key) is not None]
        if values:
            return "mysql" if min(values) >= 1 else "redis"
    return "mysql"


# The ceiling each batched strategy is held to (docs/benchmarks.md): group commit's work is
# bounded by the hot row's hand-off; the batched Redis strategies that write MySQL inside the
# request by the same SQL run raw, 32 grabs per transaction. The seeds with statements of their
# own (GrabStrategy.raw_grab) by those statements run raw. Others: their own Redis script when
# MySQL is off their path, else the raw one-grab transaction (pessimistic's statements).
BOUND_BY = {
    "group_commit": "mysql",
    "redis_queue": "mysql_raw_batched",
    "redis_counter": "mysql_raw_batched",
}
NO_CEILING_RUNS = {"bench lone"}  # one grab at a time: a latency, not a rate to hold to a ceiling


def assign_ceilings(results: list[dict[str, Any]], ceilings: list[dict[str, Any]]) -> None:
    """Set `ceiling`, `ceiling_rate` and `ceiling_ratio` on every result row (see LEGEND)."""

    def measured(kind: str, strategy: str | None = None) -> dict[str, Any] | None:
        return measured_ceiling(ceilings, kind, strategy)

    # Over HTTP the web server's own ceiling applies too, measured by the run's own generator:
    # the lower of the two bounds the run.
    web = {"Locust": measured("web"), "wrk": measured("web_wrk")}
    # A hot burst's p99 is held to its requests ÷ the ping's rate + 1 s: the ping in the same
    # shape (every user at once on its own connection) where it was measured (wrk: the mean of
    # the bursts just before and just after the run, else the one at the start), and the
    # kept-alive ping of the run's own generator beside it.
    burst = {"Locust": None, "wrk": measured("web_burst")}
    for name in dict.fromkeys(r["strategy"] for r in results):
        rows = [r for r in results if r["strategy"] == name]
        bench_rows = [r for r in rows if r["run"].startswith("bench")]
        if name in BOUND_BY:
            storage = measured(BOUND_BY[name])
        elif registry.get(name).raw_grab is not None:
            storage = measured("mysql_raw_seed", name) or measured("mysql_raw")
        elif storage_bound(bench_rows or rows) == "redis":
            storage = measured("redis", name) or measured("redis")
        else:
            storage = measured("mysql_raw") or measured("mysql")
        # The strategy's own statements run raw, one grab each (the seeds') or 32 per
        # transaction (the batched ones that write inside the request): the bench throughput
        # run's share of it is what this project's Python leaves of what MySQL does with the
        # same SQL (a hot run's requests are mostly answered from memory).
        own_sql = measured("mysql_raw_batch_own", name) or measured("mysql_raw_seed", name)
        for row in rows:
            if own_sql and row["run"] == "bench throughput" and row.get("requests_per_s"):
                row["own_sql_ratio"] = round(row["requests_per_s"] / own_sql["requests_per_s"], 4)
            bound = storage
            if row["run"].startswith("HTTP"):
                generator = "wrk" if row["run"].endswith("(wrk)") else "Locust"
                candidates = [c for c in (storage, web[generator]) if c is not None]
                bound = min(candidates, key=lambda c: c["requests_per_s"]) if candidates else None
                if row["run"].startswith("HTTP hot"):
                    _p99_budget(row, "kept_alive", web[generator])
                    rate = burst_ping_per_s(row, burst[generator])
                    _p99_budget(row, "burst", {"requests_per_s": rate} if rate else None)
            if row["run"] in NO_CEILING_RUNS:
                bound = None
            row["ceiling"] = bound["name"] if bound else None
            row["ceiling_rate"] = bound["requests_per_s"] if bound else None
            rate = row.get("requests_per_s")
            row["ceiling_ratio"] = (
                round(rate / bound["requests_per_s"], 4) if bound and rate is not None else None
            )


def measured_ceiling(
    ceilings: list[dict[str, Any]], kind: str, strategy: str | None = None
) -> dict[str, Any] | None:
    """The first ceiling of `kind` (and `strategy`) that has a rate, or None."""
    for c in ceilings:
        if c["kind"] == kind and c.get("strategy") == strategy and c.get("requests_per_s"):
            return c
    return None


def burst_ping_per_s(row: dict[str, Any], start: dict[str, Any] | None) -> float | None:
    """The ping rate a hot burst's p99 budget reads: the mean of the ping bursts beside it
    (`burst_bracket`), else the one at the start (`start`, its ceiling row), else None."""
    beside = row.get("ping_burst_beside_per_s")
    if beside:
        return float(beside)
    return float(start["requests_per_s"]) if start else None


def p99_budget_ms(requests_sent: int, ping_per_s: float) -> float:
    """The hot target: a burst's p99 within its requests ÷ the ping's rate + 1 s (in ms)."""
    return round(1000 * requests_sent / ping_per_s + 1000, 1)


def _p99_budget(row: dict[str, Any], shape: str, ping: dict[str, Any] | None) -> None:
    """Set `p99_budget_<shape>_ms` (requests ÷ `ping`'s rate + 1 s) and
    `p99_within_<shape>` on a hot burst's row; nothing without that ping."""
    requests_sent, p99 = row.get("requests"), row.get("p99_ms")
    if ping is None or not requests_sent:
        return
    budget = p99_budget_ms(requests_sent, ping["requests_per_s"])
    row[f"p99_budget_{shape}_ms"] = budget
    row[f"p99_within_{shape}"] = p99 is not None and p99 <= budget


class Compare:
    def __init__(self, config: CompareConfig, log: Callable[[str], None]) -> None:
        self.config = config
        self.log = log
        self.services: list[processes.Running] = []
        self.results: list[dict[str, Any]] = []
        self.ceilings: list[dict[str, Any]] = []
        self.names = config.strategies or registry.names()
        self.backlog: str | None = None
        self.not_quiet = 0  # HTTP runs started while the server still held earlier connections
        self.round_label = ""  # in the names of a repeated wrk run's logs (`_wrk_rounds`)
        self.host = f"http://127.0.0.1:{config.port}"
        config.work_dir.mkdir(parents=True, exist_ok=True)
        self.env = self._env()

    def _env(self) -> dict[str, str]:
        """What every child process sees: this environment, with the lab's limits raised."""
        env = dict(os.environ)
        env.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")
        largest = max(self.config.hot_packets, self.config.throughput_packets)
        env["REDPACK_MAX_COUNT"] = str(max(largest, settings.REDPACK_MAX_COUNT))
        if any(not registry.get(n).safe for n in self.names):
            env["REDPACK_ALLOW_UNSAFE_STRATEGIES"] = "1"  # the baseline is part of the table
        # Crediting the grabs to wallets (redpack/ledger.py) is the same background work for
        # every strategy and never on a grab's path: on these two shared cores it would only
        # blur the runs, so the lab's beat does not start it; every grab is credited after the
        # last run (`_credit_grabs`), and that pass is measured and reported too.
        env["REDPACK_CREDIT_INTERVAL"] = str(CREDIT_DEFERRED_SECONDS)
        return env

    def run(self) -> int:
        config = self.config
        load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        started = time.monotonic()
        self.log(f"strategies: {', '.join(self.names)}")
        self.backlog = backlog_before()
        if self.backlog:
            self.log(f"warning: {self.backlog}")
        self._bench_users()
        self._measure_storage_ceilings()
        try:
            if self._celery_wanted():
                self._start_celery()
            if not config.skip_bench:
                self._check_connections()
            for name in [] if config.skip_bench else self.names:
                in_flight = bench_concurrency(config, name)
                self._bench(
                    name, "bench hot", config.hot_packets, config.hot_users, concurrency=in_flight
                )
                self._bench(
                    name,
                    "bench throughput",
                    config.throughput_packets,
                    config.throughput_users,
                    concurrency=in_flight,
                )
                if config.lone_grabs:
                    self._bench(
                        name, "bench lone", config.lone_grabs, config.lone_grabs, concurrency=1
                    )
            if not config.skip_http:
                # After the last direct run: the web server's threads keep the MySQL
                # connections they used, which the bench's would not fit beside.
                self._start_web()
                self._measure_web_ceiling()
            for name in [] if config.skip_http else self.names:
                # The timed runs first, then the bursts: for seconds after a burst of
                # 10,000 connections the server is still closing them, and the 64 that a
                # timed run then opens at once can all land on one gunicorn worker
                # (measured: 1,080 grabs/s before a burst, 600 right after it, 1,084 after
                # 15 s; thousands of sockets in CLOSE-WAIT for over 10 s), which would
                # measure the burst's wake.
                if not config.skip_locust:
                    self._locust(name, "throughput")
                if wrk.available():
                    self._wrk_rounds(name, "throughput")
                if not config.skip_locust:
                    self._locust(name, "hot")
                if wrk.available():
                    self._wrk_rounds(name, "hot")
        finally:
            for service in reversed(self.services):
                service.stop()
        # Each strategy's rows together (its direct runs, then its HTTP runs, each in the order
        # they ran), although every direct run came before the first HTTP run.
        order = {name: index for index, name in enumerate(self.names)}
        self.results.sort(key=lambda row: order.get(row["strategy"], len(order)))
        books = self._credit_grabs()
        assign_ceilings(self.results, self.ceilings)
        self._write(load_before, time.monotonic() - started, books)
        self._print_ratios()
        failed = failures(self.results, self.ceilings, books)
        for line in failed:
            self.log(line)
        return 1 if failed else 0

    def _credit_grabs(self) -> dict[str, Any]:
        """Credit every grab of the runs to its grabber's wallet (what the crediting task does
        in the background), then audit the books: how many, how fast, and the verdict."""
        self.log("crediting the runs' grabs to wallets, then auditing the books")
        meters = Meters()
        before = meters.snapshot()
        started, python_started = time.monotonic(), time.thread_time()
        credited = 0
        while done := ledger.grabs_credit(batch=settings.REDPACK_CREDIT_BATCH, run_seconds=60):
            credited += done
        seconds = time.monotonic() - started
        python = time.thread_time() - python_started
        mysql = Meters.usage(before, meters.snapshot()).mysql_cpu
        unsafe = [n for n in registry.names() if not registry.get(n).safe]
        books = audit_books(drained=True, unowed=unsafe)
        found = {
            "credited": credited,
            "seconds": round(seconds, 1),
            "credits_per_s": round(credited / seconds, 1) if seconds else None,
            # What a credit costs: this thread's CPU (the task's Python) and MySQL's, per grab.
            "python_us_per_credit": round(1e6 * python / credited) if credited else None,
            "mysql_us_per_credit": (
                round(1e6 * mysql / credited) if credited and mysql is not None else None
            ),
            "not_credited_unsafe": books.uncredited_unowed,
            "ok": books.ok,
            "violations": books.violations,
        }
        verdict = "ok" if books.ok else "FAILED"
        self.log(
            f"  {credited} grabs credited in {seconds:.1f} s"
            f" ({found['python_us_per_credit']} µs of Python and {found['mysql_us_per_credit']}"
            f" of MySQL each); books {verdict}"
        )
        return found

    # --- preparation ---------------------------------------------------------------------

    def _bench_users(self) -> None:
        c = self.config
        count = max(c.hot_users, c.throughput_users, 0 if c.skip_http else c.http_users)
        self.log(f"bench users: {count}")
        ids, created = bench_users_ensure(count=count)
        self.users_csv = self.config.work_dir / "bench-users.csv"
        bench_users_write_csv(user_ids=ids, path=self.users_csv, ttl=timedelta(days=1))
        self.sender_token = bench_authorization(bench_sender(), ttl=timedelta(days=1))
        self.log(f"  {created} created, tokens in {self.users_csv}")

    def _measure_storage_ceilings(self) -> None:
        c = self.config
        self.log("ceiling: MySQL hot-row UPDATE")
        found = [ceiling_runs.mysql_hot_row(queries=c.ceiling_queries, concurrency=c.concurrency)]
        for per_transaction in (1, 32):
            self.log(f"ceiling: MySQL raw grab transaction, {per_transaction} per transaction")
            found.append(
                ceiling_runs.mysql_raw_grabs(
                    per_transaction=per_transaction,
                    grabs=c.ceiling_queries,
                    concurrency=RAW_CONCURRENCY,
                )
            )
        for name in ceiling_runs.raw_strategies(self.names):
            self.log(f"ceiling: MySQL raw {name} statements")
            found.append(
                ceiling_runs.mysql_raw_seed(
                    name, grabs=c.seed_ceiling_grabs, concurrency=RAW_CONCURRENCY
                )
            )
        for name in ceiling_runs.batch_strategies(self.names):
            self.log(f"ceiling: MySQL raw {name} batch transaction, 32 grabs each")
            found.append(
                ceiling_runs.mysql_raw_batch(
                    name, per_transaction=32, grabs=c.ceiling_queries, concurrency=RAW_CONCURRENCY
                )
            )
        self.log("ceiling: Redis representative grab script")
        found.append(
            ceiling_runs.redis_representative(
                requests=c.ceiling_requests, concurrency=c.concurrency
            )
        )
        for name in self.names:
            own = ceiling_runs.redis_strategy(
                name, requests=c.ceiling_requests, concurrency=c.concurrency
            )
            if own is not None:
                self.log(f"ceiling: {own.name}")
                found.append(own)
        self.ceilings.extend(asdict(x) for x in found)
        for x in found:
            self.log(
                f"  {x.name}: {_rate(x.requests_per_s)} {x.note if not x.requests_per_s else ''}"
            )

    def _celery_wanted(self) -> bool:
        if self.config.celery != "auto":
            return self.config.celery == "on"
        tasks = celery_tasks()
        if tasks:
            self.log(f"Celery tasks found ({', '.join(tasks)}): starting a worker and beat")
        return bool(tasks)

    def _start(self, name: str, command: list[str], log: str) -> processes.Running:
        return processes.Running(
            name, command, env=self.env, cwd=BASE_DIR, log=self.config.work_dir / log
        )

    def _start_web(self) -> None:
        c = self.config
        command = [sys.executable, "-m", "gunicorn", "redpack.wsgi:application"]
        command += ["--bind", f"127.0.0.1:{c.port}", "--workers", str(c.web_workers)]
        command += ["--threads", str(c.web_threads), "--timeout", "300", "--log-level", "warning"]
        self.log(f"starting gunicorn: {c.web_workers} workers × {c.web_threads} threads")
        self.services.append(self._start("gunicorn", command, "gunicorn.log"))
        server = self.services[-1]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.alive():
            try:
                healthy = requests.get(f"{self.host}/healthz", timeout=5).status_code == 200
            except requests.RequestException:
                healthy = False
            time.sleep(0.5)
            if healthy and server.alive():  # not another server on that port
                return
        raise RuntimeError(f"gunicorn did not become healthy (port busy?); see {server.log}")

    def _start_celery(self) -> None:
        work = self.config.work_dir
        celery = [sys.executable, "-m", "celery", "-A", "redpack"]
        worker = [*celery, "worker", "--loglevel", "WARNING", "--concurrency", "2"]
        beat = [*celery, "beat", "--loglevel", "WARNING", "--schedule", str(work / "beat")]
        self.services.append(self._start("celery worker", worker, "celery.log"))
        self.services.append(self._start("celery beat", beat, "beat.log"))

    def _quiet(self) -> None:
        """Before each HTTP run and web ceiling: wait until the server has closed the
        connections of the runs before (processes.wait_for_quiet), so that no run measures the
        wake of a burst, whichever strategy's run the burst was."""
        waited = processes.wait_for_quiet(self.config.port, timeout=QUIET_TIMEOUT_SECONDS)
        if waited is None:
            self.not_quiet += 1
            self.log(f"  warning: the server holds connections after {QUIET_TIMEOUT_SECONDS} s")
        elif waited >= 1:
            self.log(f"  waited {waited:.1f} s for the server to close the last run's connections")

    def _measure_web_ceiling(self) -> None:
        c = self.config
        if not c.skip_locust:
            self._measure_locust_ping()
        self.log("ceiling: web server, GET /api/ping/ from wrk")
        self._quiet()
        kept = ceiling_runs.web_wrk(
            url=f"{self.host}/api/ping/",
            authorization=self.sender_token,
            seconds=c.web_seconds,
            connections=c.concurrency,
        )
        self.ceilings.append(asdict(kept))
        self.log(f"  {_rate(kept.requests_per_s)} {kept.note}")
        if wrk.available():
            self._measure_web_burst()

    def _check_connections(self) -> None:
        """Refuse, before any run, a bench that MySQL's max_connections cannot hold: each bench
        thread keeps a connection of its own, and a refused one would fail the run's audit."""
        if connection.vendor != "mysql":
            return
        wanted = max(bench_concurrency(self.config, name) for name in self.names)
        with connection.cursor() as cursor:
            limit, connected = mysql_room(cursor)
        room = limit - connected
        if wanted + BENCH_CONNECTIONS_SPARE > room:
            raise RuntimeError(
                f"the bench keeps {wanted} MySQL connections and MySQL has room for {room}"
                f" (max_connections {limit}, {connected} connected): raise max_connections or"
                " lower --concurrency / --batched-concurrency"
            )

    def _measure_locust_ping(self) -> None:
        c = self.config
        self.log("ceiling: web server, GET /api/ping/")
        summary, _, code = self._run_locust(
            "ping", None, users=c.concurrency, seconds=c.web_seconds, extra=[]
        )
        rate = summary.get("requests_per_s") if summary else None
        self.ceilings.append(
            {
                "name": "Web: GET /api/ping/ (JWT, one Redis round trip), Locust",
                "kind": "web",
                "tool": f"Locust -u {c.concurrency}, gunicorn {c.web_workers}×{c.web_threads}",
                "requests_per_s": rate,
                "p50_ms": summary.get("p50_ms") if summary else None,
                "p99_ms": summary.get("p99_ms") if summary else None,
                "note": "" if rate else f"locust exited {code}",
                "strategy": None,
                "failed": summary.get("failures", 0) if summary else 0,
            }
        )
        self.log(f"  {_rate(rate)}")

    def _measure_web_burst(self) -> None:
        """The ping in the hot burst's shape, from wrk: every hot user at once on a connection
        of its own, one request each. Accepting thousands of connections at once costs the
        server more per request than kept-alive requests do, so a hot burst's p99 is held to
        users ÷ the rate of this shape + 1 s, beside the kept-alive ping's budget
        (`_p99_budget`): of the ping bursts just before and just after it (`_ping_burst_beside`),
        else of this one."""
        c = self.config
        self.log(f"ceiling: web server, GET /api/ping/ burst from wrk ({c.hot_users} connections)")
        name = "Web: GET /api/ping/ burst, one connection per user, wrk"
        self._quiet()
        try:
            summary = self._wrk_ping_burst("wrk-ping-burst.log")
        except RuntimeError as exc:
            found = Ceiling(name, "web_burst", "wrk", None, note=f"failed: {exc}")
        else:
            pongs = summary["statuses"].get("200", 0)
            note = (
                f"{pongs} of {summary['requests']} answered 200 in {summary['seconds']} s;"
                f" wrk's own CPU {100 * (summary['generator_cpu_share'] or 0):.0f}%"
                f" of {wrk.THREADS} cores"
            )
            if summary["generator_bound"]:
                note += "; generator-bound: not a ceiling of the server"
            found = Ceiling(
                name,
                "web_burst",
                f"wrk -t{wrk.THREADS} -c{summary['connections']}, one request each",
                _burst_rate(summary),
                p50_ms=summary["p50_ms"],
                p99_ms=summary["p99_ms"],
                note=note,
                failed=not_answered_200(summary),
            )
        self.ceilings.append(asdict(found))
        self.log(f"  {_rate(found.requests_per_s)} {found.note}")

    # --- runs ----------------------------------------------------------------------------

    def _bench(
        self, name: str, run: str, packets: int, users: int, *, concurrency: int | None = None
    ) -> None:
        c = self.config
        concurrency = concurrency or c.concurrency
        self.log(f"{name}: {run} ({packets} packets, {users} users, concurrency {concurrency})")
        command = [sys.executable, str(BASE_DIR / "manage.py"), "bench", "--strategy", name]
        command += ["--packets", str(packets), "--users", str(users), "--json"]
        processes_ = min(c.bench_processes, concurrency)
        command += ["--concurrency", str(concurrency), "--processes", str(processes_)]
        done = processes.run(command, env=self.env, cwd=BASE_DIR)
        try:
            figures = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.log(f"  bench failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
            failed = {"strategy": name, "safe": registry.get(name).safe, "run": run}
            failed.update(audit_ok=False, violations=[done.stderr.strip()[-300:]])
            self.results.append(failed)
            return
        figures.update(run=run, exit_code=done.returncode)
        self.results.append(figures)
        self.log("  " + _line(figures))

    def _locust(self, name: str, scenario: str) -> None:
        c = self.config
        if scenario == "hot":
            users, seconds, packets = c.hot_users, c.hot_seconds, c.hot_packets
        else:
            users, seconds, packets = c.concurrency, c.throughput_seconds, c.throughput_packets
        self.log(f"{name}: HTTP {scenario} ({packets} packets, {users} Locust users)")
        self._quiet()
        # Sent here rather than by the locustfile, so that preparing a large activity is not
        # part of Locust's --run-time.
        activity_id = self._send(name, packets)
        meters = Meters(watch=[s.psutil for s in self.services])
        before = meters.snapshot()
        extra = ["--strategy", name, "--packets", str(packets), "--activity", str(activity_id)]
        summary, summary_path, code = self._run_locust(
            scenario, name, users=users, seconds=seconds, extra=extra
        )
        row: dict[str, Any] = {"strategy": name, "safe": registry.get(name).safe}
        row.update(summary or {"audit_ok": False, "violations": [f"locust exited {code}"]})
        row.pop("answers", None)
        row.update(run=f"HTTP {scenario}", exit_code=code, summary=_relative(summary_path))
        self._add_http_row(row, Meters.usage(before, meters.snapshot()))

    def _wrk_rounds(self, name: str, scenario: str) -> None:
        """`_wrk` as many times as the config's rounds (each round's wrk logs named with
        `-r<round>`), its rows then one (`median_round`)."""
        rounds = self.config.rounds
        first = len(self.results)
        for index in range(rounds):
            if rounds > 1:
                self.log(f"{name}: round {index + 1} of {rounds}")
                self.round_label = f"-r{index + 1}"
            try:
                self._wrk(name, scenario)
            finally:
                self.round_label = ""
        if rounds > 1:
            rows = self.results[first:]
            del self.results[first:]
            kept = median_round(rows, start_burst=measured_ceiling(self.ceilings, "web_burst"))
            self.results.append(kept)
            self.log(f"  the median of {len(rows)} rounds: round {kept['median_round']}")

    def _wrk(self, name: str, scenario: str) -> None:
        """The same run from wrk (wrk.py): `hot`, every user at once on its own connection;
        `throughput`, `concurrency` connections grabbing back to back."""
        c = self.config
        hot = scenario == "hot"
        users = c.hot_users if hot else c.http_users
        packets = c.hot_packets if hot else c.throughput_packets
        connections = users if hot else c.concurrency
        seconds = c.hot_seconds if hot else c.throughput_seconds
        self.log(f"{name}: HTTP {scenario} from wrk ({packets} packets, {connections} connections)")
        ping = self._ping_burst_beside(name, "before") if hot else self._ping_beside(name, "before")
        activity_id = self._send(name, packets)
        meters = Meters(watch=[s.psutil for s in self.services])
        before = meters.snapshot()
        try:
            summary = wrk.grab_run(
                url=f"{self.host}/api/activities/{activity_id}/grab/",
                tokens=self._tokens(users),
                once=hot,
                connections=connections,
                seconds=seconds,
                log=c.work_dir / f"wrk-{name}-{scenario}{self.round_label}.log",
            )
        except RuntimeError as exc:
            summary = {"audit_ok": False, "violations": [str(exc)]}
        usage = Meters.usage(before, meters.snapshot())
        row: dict[str, Any] = {"strategy": name, "safe": registry.get(name).safe}
        row.update(summary, run=f"HTTP {scenario} (wrk)", activity_id=activity_id)
        if not hot and row.get("requests", 0) > users:
            # wrk takes the users round and round: past the last one, a request is a user's
            # second grab (already_grabbed), cheaper than a grab; the run says so. At least
            # this many: each wrk thread goes round its own share of the users.
            row["repeated_users"] = row["requests"] - users
            self.log(f"  warning: {row['repeated_users']} requests past the {users} users")
        granted = row.pop("granted", None)
        if granted is not None:
            # Rows nobody heard of can only be the grabs of requests without an answer.
            without_answer = row["unanswered"] + row["causes"].get("cut_off", 0)
            row.update(
                wrk.audit_answers(name, activity_id, granted, cut_off_at_most=without_answer)
            )
        self._add_http_row(row, usage)
        # The pings after the run, once the server has written its grabs (the audit above
        # waited for that): a hot burst's budget and a many-packets run's share read the mean
        # of the pings on either side.
        if hot:
            row.update(burst_bracket(ping, self._ping_burst_beside(name, "after")))
            beside = row.get("ping_burst_beside_per_s")
            self.log(
                f"  ping bursts beside it: {_rate(beside)}"
                if beside
                else "  no ping burst beside it: the one at the start sets the budget"
            )
        else:
            row.update(ping_bracket(ping, self._ping_beside(name, "after"), row))
            self.log(
                f"  {report.beside_cell(report.beside_of(row))} of the pings beside it"
                f" ({_rate(row.get('ping_beside_per_s'))})"
                if row.get("of_ping_beside") is not None
                else "  no ping beside it"
            )

    def _ping_beside(self, name: str, when: str) -> "Beside":
        """The kept-alive ping from wrk again, just `before` or `after` a strategy's
        many-packets run, on the same connections for as long as the run, from the same
        generator (wrk_grab.lua, each request as the next of the same users): on a shared
        machine the server's pace drifts over a long comparison (measured here: the same ping
        1,100 to 1,650/s within an hour, and 856 then 1,221/s a minute apart), so a grab run's
        share of the ping is read against the pings on either side of it (`ping_bracket`), as
        well as against the one at the start (`of ceiling`, plain wrk with one token)."""
        c = self.config
        self._quiet()  # after a run, once the server has closed its connections
        try:
            ping = self._wrk_ping(
                c.http_users,
                once=False,
                connections=c.concurrency,
                seconds=c.throughput_seconds,
                log=f"wrk-{name}-ping-{when}{self.round_label}.log",
            )
        except RuntimeError as exc:
            self.log(f"  ping {when} it: failed ({exc})")
            return Beside(None, None)
        share = ping.get("generator_cpu_share")
        self.log(
            f"  ping {when} it: {_rate(ping['requests_per_s'])}"
            f" (wrk's own CPU {share if share is None else f'{100 * share:.0f}%'} of its cores,"
            f" {ping.get('unanswered', 0)} unanswered; {_steal(ping)})"
        )
        self._quiet()  # its connections closed before whatever comes next
        rate = float(ping["requests_per_s"]) if ping.get("requests_per_s") else None
        return Beside(rate, ping["steal_share"], not_answered_200(ping))

    def _ping_burst_beside(self, name: str, when: str) -> "Beside":
        """The ping burst again (`_measure_web_burst`'s shape), just `before` or `after` a
        strategy's hot burst: a hot burst's p99 budget is its requests ÷ the mean rate of the
        two + 1 s (`burst_bracket`, `assign_ceilings`), for the reason `_ping_beside` gives.
        Its rate is None when the burst was not answered in full or wrk was its bottleneck
        (with neither rate, the one at the start counts)."""
        self._quiet()
        try:
            ping = self._wrk_ping_burst(f"wrk-{name}-ping-burst-{when}{self.round_label}.log")
        except RuntimeError as exc:
            self.log(f"  ping burst {when} it: failed ({exc})")
            return Beside(None, None)
        pongs = ping["statuses"].get("200", 0)
        self.log(
            f"  ping burst {when} it: {_rate(ping['requests_per_s'])}, p99 {ping['p99_ms']} ms"
            f" ({pongs} of {ping['requests']} answered 200; {_steal(ping)})"
        )
        self._quiet()
        return Beside(_burst_rate(ping), ping["steal_share"], not_answered_200(ping))

    def _wrk_ping_burst(self, log: str) -> dict[str, Any]:
        """The ping in the hot burst's shape: every hot user at once, one request each on a
        connection of its own."""
        c = self.config
        return self._wrk_ping(
            c.hot_users, once=True, connections=c.hot_users, seconds=c.hot_seconds, log=log
        )

    def _wrk_ping(
        self, users: int, *, once: bool, connections: int, seconds: int, log: str
    ) -> dict[str, Any]:
        """`GET /api/ping/` from wrk with the grab runs' script (wrk.grab_run), as the first
        `users` bench users; `log` under the work dir, with the machine's busy and steal
        shares over the run (meters.machine_shares). RuntimeError when wrk gives no result."""
        tokens = self._tokens(users)
        before = machine_times()
        summary = wrk.grab_run(
            url=f"{self.host}/api/ping/",
            tokens=tokens,
            once=once,
            connections=connections,
            seconds=seconds,
            log=self.config.work_dir / log,
            method="GET",
        )
        summary.update(machine_shares(before, machine_times()))
        return summary

    def _tokens(self, count: int) -> list[str]:
        """The Authorization values of the first `count` bench users (the users CSV)."""
        with open(self.users_csv, newline="") as handle:
            rows = list(csv.DictReader(handle))
        return [r["authorization"] for r in rows[:count]]

    def _add_http_row(self, row: dict[str, Any], usage: Usage) -> None:
        """An HTTP run's row, with what the server side (gunicorn, Celery, Redis, MySQL) spent."""
        requests_done = row.get("requests") or 0
        cpu = usage.watched_cpu + usage.redis_cpu + (usage.mysql_cpu or 0.0)
        row.update(
            mysql_queries=usage.mysql_queries,
            redis_commands=usage.redis_commands,
            cpu_seconds=round(cpu, 3),
            machine_busy_share=usage.machine_busy_share,
            steal_share=usage.steal_share,
        )
        if requests_done:
            row["mysql_queries_per_request"] = (
                None
                if usage.mysql_queries is None
                else round(usage.mysql_queries / requests_done, 3)
            )
            row["redis_commands_per_request"] = round(usage.redis_commands / requests_done, 3)
            row["cpu_seconds_per_1k_requests"] = round(1000 * cpu / requests_done, 3)
        self.results.append(row)
        self.log(f"  {_line(row)}; {_steal(row)}")

    def _send(self, name: str, packets: int) -> int:
        with override_settings(
            REDPACK_MAX_COUNT=int(self.env["REDPACK_MAX_COUNT"]),
            REDPACK_ALLOW_UNSAFE_STRATEGIES=True,
        ):
            activity = services.activity_send(
                sender_id=bench_sender().pk,
                total_amount=Decimal(packets),
                total_count=packets,
                strategy=name,
                expires_in=24 * 3600,
            )
        return activity.pk

    def _run_locust(
        self, scenario: str, name: str | None, *, users: int, seconds: int, extra: list[str]
    ) -> tuple[dict[str, Any] | None, Path, int]:
        work = self.config.work_dir
        stem = f"locust-{name or 'web'}-{scenario}"
        summary_path = work / f"{stem}.json"
        summary_path.unlink(missing_ok=True)
        command = [sys.executable, "-m", "locust", "-f", f"locustfiles/{scenario}.py"]
        command += ["--headless", "-u", str(users), "-r", str(users), "-t", f"{seconds}s"]
        command += ["--stop-timeout", "60", "--host", self.host, "--users-csv", str(self.users_csv)]
        command += ["--sender-token", self.sender_token, "--csv", str(work / stem)]
        command += ["--only-summary", "--loglevel", "WARNING", *extra]
        command += ["--summary-json", str(summary_path)]
        done = processes.run(command, env=self.env, cwd=BASE_DIR, log=work / f"{stem}.log")
        if not summary_path.exists():
            self.log(f"  locust exited {done.returncode} without a summary; see {stem}.log")
            return None, summary_path, done.returncode
        return json.loads(summary_path.read_text()), summary_path, done.returncode

    # --- output --------------------------------------------------------------------------

    def _write(self, load_before: str, seconds: float, books: dict[str, Any]) -> None:
        c = self.config
        cpus = os.cpu_count() or 1
        context = {
            "command": c.command,
            "finished_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": _git_commit(),
            "machine": report.this_machine(),
            "cpus": cpus,
            "load_before": load_before,
            "concurrency": c.concurrency,
            "batched_concurrency": c.batched_concurrency,
            "seconds": round(seconds, 1),
            "settings": [f"{k} = {_relative(v)}" for k, v in asdict(c).items() if k != "command"],
            "books": books,
        }
        warnings = []
        if float(load_before.split(",")[0]) > cpus:
            warnings.append(f"The machine was busy (load average {load_before} on {cpus} CPUs)")
        if self.backlog:
            warnings.append(f"Before the runs, {self.backlog}")
        if self.not_quiet:
            warnings.append(
                f"{self.not_quiet} HTTP runs or ceilings started while the server still held"
                f" connections of the runs before, {QUIET_TIMEOUT_SECONDS} s after them"
            )
        if warnings:
            context["warning"] = "; ".join(warnings) + ": these figures are indicative only."
        out = c.out_dir
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(
            json.dumps(
                {"context": context, "ceilings": self.ceilings, "results": self.results},
                indent=2,
                default=str,
            )
        )
        report.write_chart(out / "compare.png", results=self.results, ceilings=self.ceilings)
        report.write_markdown(
            out / "compare.md", results=self.results, ceilings=self.ceilings, context=context
        )
        self.log(f"wrote {out / 'compare.md'} and {out / 'compare.png'} in {seconds:.0f} s")

    def _print_ratios(self) -> None:
        self.log("each strategy against its ceiling:")
        for row in self.results:
            ratio = row.get("ceiling_ratio")
            shown = "n/a" if ratio is None else f"{100 * ratio:5.1f}%"
            beside = row.get("of_ping_beside")
            self.log(
                f"  {row['strategy']:<26} {row['run']:<17} {_rate(row.get('requests_per_s')):>12}"
                f"  = {shown} of {row.get('ceiling') or 'no ceiling'}"
                f" ({_rate(row.get('ceiling_rate'))})"
                + (
                    ""
                    if beside is None
                    else f"; {report.beside_cell(report.beside_of(row))} of the pings beside it"
                    f" ({_rate(row.get('ping_beside_per_s'))})"
                )
            )


def failures(
    results: list[dict[str, Any]], ceilings: list[dict[str, Any]], books: dict[str, Any]
) -> list[str]:
    """What fails a comparison, a line each: a safe strategy's run whose audit failed or that
    oversold; a no-op ping the server lost or refused, beside a run or measured as a ceiling
    (every request must be answered); books that do not balance."""
    lines = [
        f"AUDIT FAILED: {row['strategy']} {row['run']}: {row.get('violations')}"
        for row in results
        if row.get("safe") and (not row.get("audit_ok") or row.get("oversold"))
    ]
    lines += [
        f"PINGS FAILED: {row['strategy']} {row['run']}: {row['pings_failed']}"
        for row in results
        if row.get("pings_failed")
    ]
    lines += [
        f"PINGS FAILED: ceiling {c['name']}: {c['failed']:,} without a 200"
        for c in ceilings
        if c.get("failed")
    ]
    if not books["ok"]:
        lines.append(f"BOOKS FAILED: {books['violations']}")
    return lines


def round_figure(row: dict[str, Any], start_burst: dict[str, Any] | None = None) -> float | None:
    """What a wrk round is ranked by, higher better: a many-packets run's share of the pings
    beside it; a hot burst's p99 budget (`_burst_budget`) less its p99, in ms. None when the
    round has no such figure (its pings failed, nothing answered)."""
    if row["run"].startswith("HTTP hot"):
        budget, p99 = _burst_budget(row, start_burst), row.get("p99_ms")
        return None if budget is None or p99 is None else round(budget - p99, 1)
    share = row.get("of_ping_beside")
    return None if share is None else float(share)


def _burst_budget(row: dict[str, Any], start_burst: dict[str, Any] | None) -> float | None:
    """A hot burst's p99 budget in ms against its ping burst, as `assign_ceilings` sets it
    (`burst_ping_per_s`: the ones beside it, else `start_burst`, the one at the start)."""
    requests_sent, rate = row.get("requests"), burst_ping_per_s(row, start_burst)
    if not row["run"].startswith("HTTP hot") or not requests_sent or not rate:
        return None
    return p99_budget_ms(requests_sent, rate)


def median_round(
    rows: list[dict[str, Any]], start_burst: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One row for a strategy's rounds of one wrk run: the median round's, by `round_figure`
    (of an even number, the worse of the two in the middle; a round without the figure ranks
    last), with every round's figures and answers by cause in `rounds` (in the order they
    ran) and `median_round` (its number, from 1). What every round must hold is taken from
    all of them: the audit passes only if it passed in every round (`violations` names the
    round), `pings_failed` lists every round's, and `oversold` and `duplicates` are the
    largest of any round. `start_burst`: the
    ping burst at the start, for a hot round without ping bursts beside it."""
    figures = [round_figure(row, start_burst) for row in rows]
    ranked = sorted(range(len(rows)), key=lambda i: (figures[i] is None, -(figures[i] or 0.0)))
    chosen = ranked[len(rows) // 2]
    kept = dict(rows[chosen])
    kept["median_round"] = chosen + 1
    kept["rounds"] = [
        {
            "figure": figure,
            "requests_per_s": row.get("requests_per_s"),
            "p99_ms": row.get("p99_ms"),
            "p99_budget_ms": _burst_budget(row, start_burst),
            "unanswered": row.get("unanswered"),
            "causes": dict(row.get("causes") or {}),
            "audit_ok": bool(row.get("audit_ok")),
            "activity_id": row.get("activity_id"),
        }
        for row, figure in zip(rows, figures, strict=True)
    ]
    kept["audit_ok"] = all(row.get("audit_ok") for row in rows)
    kept["violations"] = [
        f"round {index}: {violation}"
        for index, row in enumerate(rows, 1)
        for violation in row.get("violations") or []
    ]
    failed = [
        f"round {index}: {ping}"
        for index, row in enumerate(rows, 1)
        for ping in row.get("pings_failed") or []
    ]
    kept.pop("pings_failed", None)
    if failed:
        kept["pings_failed"] = failed
    for key in ("oversold", "duplicates"):
        values = [row[key] for row in rows if row.get(key) is not None]
        if values:
            kept[key] = max(values)
    return kept


def ping_bracket(before: "Beside", after: "Beside", row: dict[str, Any]) -> dict[str, Any]:
    """A many-packets run's share of the pings on either side of it: against their mean
    (`of_ping_beside`, the figure the target reads), and against each (`of_ping_before`,
    `of_ping_after`: how far the machine's pace moved over the run, the figure's own noise).
    A ping that failed leaves the other alone; with neither, no share."""
    fields = _bracketed("ping", before, after)
    rate = row.get("requests_per_s")
    if "ping_beside_per_s" not in fields or not rate:
        return {k: v for k, v in fields.items() if k in ("steal_share_beside", "pings_failed")}
    fields["of_ping_beside"] = round(rate / fields["ping_beside_per_s"], 4)
    for when, ping in (("before", before), ("after", after)):
        if ping.rate is not None:
            fields[f"of_ping_{when}"] = round(rate / ping.rate, 4)
    return fields


def burst_bracket(before: "Beside", after: "Beside") -> dict[str, Any]:
    """A hot burst's ping bursts on either side of it: their mean rate
    (`ping_burst_beside_per_s`, which sets the burst's p99 budget) and each one's."""
    return _bracketed("ping_burst", before, after)


def _bracketed(name: str, before: "Beside", after: "Beside") -> dict[str, Any]:
    """`<name>_beside_per_s`, the mean rate of the pings that have one, `<name>_before_per_s`
    and `<name>_after_per_s`, `steal_share_beside`, the mean of their steal shares, and
    `pings_failed` when a ping had requests without a 200 (one line each)."""
    fields: dict[str, Any] = {}
    label = name.replace("_", " ")
    failed = [
        f"the {label} {when} it: {ping.failed:,} without a 200"
        for when, ping in (("before", before), ("after", after))
        if ping.failed
    ]
    if failed:
        fields["pings_failed"] = failed
    steals = [ping.steal_share for ping in (before, after) if ping.steal_share is not None]
    if steals:
        fields["steal_share_beside"] = round(sum(steals) / len(steals), 4)
    rates = [ping.rate for ping in (before, after) if ping.rate is not None]
    if rates:
        fields[f"{name}_beside_per_s"] = round(sum(rates) / len(rates), 1)
    for when, ping in (("before", before), ("after", after)):
        if ping.rate is not None:
            fields[f"{name}_{when}_per_s"] = ping.rate
    return fields


class Beside(NamedTuple):
    """A ping measured just before (or after) a strategy's HTTP run: its rate (None when it
    cannot bound the run), the machine's steal share over it, and its requests that got no
    200 (`failed`: a no-op the server lost or refused, which fails the comparison)."""

    rate: float | None
    steal_share: float | None
    failed: int = 0


def not_answered_200(summary: dict[str, Any]) -> int:
    """A ping's requests (those cut off by a timed run's stop aside) without a 200 answer."""
    return max(0, (summary.get("requests") or 0) - summary["statuses"].get("200", 0))


def _steal(summary: dict[str, Any]) -> str:
    """A run's steal share for the log, as the report shows it."""
    return f"steal {report.steal_cell(summary.get('steal_share'), None)}"


def _burst_rate(summary: dict[str, Any]) -> float | None:
    """A ping burst's rate, if it can bound a hot burst: every request answered 200, and wrk
    not its bottleneck."""
    usable = summary["statuses"].get("200", 0) == summary["requests"]
    usable = usable and not summary["generator_bound"]
    rate = summary.get("requests_per_s")
    return float(rate) if usable and rate else None


def _relative(value: object) -> object:
    """Paths inside the checkout as relative paths: the report is committed."""
    if isinstance(value, Path) and value.is_relative_to(BASE_DIR):
        return str(value.relative_to(BASE_DIR))
    return value


def _git_commit() -> str:
    try:
        done = processes.run(["git", "rev-parse", "--short", "HEAD"], cwd=BASE_DIR)
        return done.stdout.strip() or "?"
    except OSError:
        return "?"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}/s"


def _line(row: dict[str, Any]) -> str:
    return (
        f"{_rate(row.get('requests_per_s'))}, grabbed {row.get('grabbed')}, "
        f"p99 {row.get('p99_ms')} ms, oversold {row.get('oversold')}, "
        f"audit {'ok' if row.get('audit_ok') else 'FAILED'}"
    )
