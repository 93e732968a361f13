"""The direct bench: processes × threads calling `services.activity_grab`, then settle, audit,
measure.

No HTTP: this measures a strategy and its stores (MySQL, Redis), with Python's own cost per
grab. Each process has its own Django setup and connections (spawned, not forked) and each
thread its own database connection, as in a threaded web worker. Every user grabs `clicks`
times; the clicks of one user land in different processes at about the same moment.
"""

import math
import multiprocessing
import os
import queue
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.test.utils import override_settings

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity
from redpack.money import from_cents
from strategies import registry
from strategies.base import Outcome

from . import bench_worker
from .bench_worker import START_TIMEOUT, WorkerSpec
from .meters import Meters
from .results import BenchResult, Failure, Ready, WorkerReport
from .stats import percentile, share, success_rate
from .users import bench_sender, bench_users_ensure

# Settings a spawned worker copies from the parent, so it talks to exactly the same stores
# (under pytest the database name is the test database's, set at run time).
INHERITED_SETTINGS = (
    "DATABASES",
    "CACHES",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "REDPACK_STRATEGIES",
    "REDPACK_ALLOW_UNSAFE_STRATEGIES",
)


# One bench process per core: batches of concurrent grabs form only inside a process
# (strategies/combiner.py), so more threads per process, not more processes, let them grow.
DEFAULT_PROCESSES = os.cpu_count() or 2


@dataclass(frozen=True)
class BenchConfig:
    strategy: str
    packets: int = 100
    users: int = 10_000
    concurrency: int = 64
    processes: int = DEFAULT_PROCESSES
    clicks: int = 1
    allocation: str = "double_average"
    amount_cents: int | None = None  # default: one yuan (100 cents) per packet
    settle_timeout: float = 60.0
    user_prefix: str = "bench"


class BenchError(Exception):
    """The bench could not run (a worker failed to start or died)."""


def run_bench(
    config: BenchConfig, *, progress: Callable[[int, int], None] | None = None
) -> BenchResult:
    """Run one bench and return its figures; `progress(done, total)` is called while it runs."""
    strategy = registry.get(config.strategy)  # KeyError: not configured
    # The unsafe baseline belongs in the comparison: allow it here, for this run only.
    allow_unsafe = override_settings(REDPACK_ALLOW_UNSAFE_STRATEGIES=True)
    with nullcontext() if strategy.safe else allow_unsafe:
        return _run(config, strategy_safe=strategy.safe, progress=progress)


def _run(
    config: BenchConfig, *, strategy_safe: bool, progress: Callable[[int, int], None] | None
) -> BenchResult:
    user_ids, _ = bench_users_ensure(count=config.users, prefix=config.user_prefix)
    sender = bench_sender(prefix=config.user_prefix)
    amount_cents = config.amount_cents or 100 * config.packets
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=from_cents(amount_cents),
        total_count=config.packets,
        strategy=config.strategy,
        allocation_kind=config.allocation,
        expires_in=24 * 3600,
    )
    clicks = [user_id for user_id in user_ids for _ in range(config.clicks)]
    processes = max(1, min(config.processes, config.concurrency))
    threads = max(1, math.ceil(config.concurrency / processes))
    settings_values = {name: getattr(settings, name) for name in INHERITED_SETTINGS}
    specs = [
        WorkerSpec(
            settings_module=os.environ.get("DJANGO_SETTINGS_MODULE", "redpack.settings"),
            settings_values=settings_values,
            activity_id=activity.pk,
            strategy=config.strategy,
            clicks=clicks[p::processes],
            threads=threads,
            first_slot=p * threads,
        )
        for p in range(processes)
    ]

    context = multiprocessing.get_context("spawn")
    go = context.Event()
    results: multiprocessing.Queue = context.Queue()
    done_counts = context.Array("q", processes * threads, lock=False)  # one slot per thread
    workers = [
        context.Process(
            target=bench_worker.main, args=(spec, go, results, done_counts), daemon=True
        )
        for spec in specs
    ]
    meters = Meters()
    connection.close()  # the parent's connection is idle while the workers run
    for worker in workers:
        worker.start()
    try:
        _wait_until_ready(workers, results)
        before = meters.snapshot()
        go.set()
        reports = _collect(workers, results, done_counts, len(clicks), progress)
    finally:
        go.set()  # a worker still waiting must not wait out its timeout
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()
    grabs_ended = time.monotonic()
    settled = registry.get(config.strategy).settle(
        activity_id=activity.pk, timeout=config.settle_timeout
    )
    settle_seconds = time.monotonic() - grabs_ended
    after = meters.snapshot()
    # Each thread's closing SHOW SESSION STATUS is a statement inside the window.
    measuring = sum(r.session_reads for r in reports)
    usage = Meters.usage(before, after, own_mysql_statements=measuring)

    activity = Activity.objects.get(pk=activity.pk)
    answers = [(user, cents) for r in reports for user, cents in r.answers]
    audit = audit_activity(activity, answers=answers)  # type: ignore[arg-type]
    return _figures(
        config=config,
        strategy_safe=strategy_safe,
        activity=activity,
        processes=processes,
        threads=threads,
        reports=reports,
        answers=answers,
        audit=audit,
        usage=usage,
        settled=settled,
        settle_seconds=settle_seconds,
    )


def _next_message(
    workers: list[Any], results: multiprocessing.Queue
) -> Ready | WorkerReport | None:
    """The next message from a worker, None after a short wait; BenchError if one failed."""
    try:
        message = results.get(timeout=0.2)
    except queue.Empty:
        dead = [w for w in workers if w.exitcode not in (None, 0)]
        if dead and results.empty():
            raise BenchError(f"bench worker exited with code {dead[0].exitcode}") from None
        return None
    if isinstance(message, Failure):
        raise BenchError(message.message)
    return message


def _wait_until_ready(workers: list[Any], results: multiprocessing.Queue) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    ready = 0
    while ready < len(workers):
        if time.monotonic() > deadline:
            raise BenchError(f"only {ready} of {len(workers)} bench workers started")
        if _next_message(workers, results) is not None:
            ready += 1


def _collect(
    workers: list[Any],
    results: multiprocessing.Queue,
    done_counts: Any,
    total: int,
    progress: Callable[[int, int], None] | None,
) -> list[WorkerReport]:
    reports: list[WorkerReport] = []
    while len(reports) < len(workers):
        report = _next_message(workers, results)
        if isinstance(report, WorkerReport):
            reports.append(report)
        elif progress:
            progress(sum(done_counts), total)
    if progress:
        progress(total, total)
    return reports


def _figures(
    *,
    config: BenchConfig,
    strategy_safe: bool,
    activity: Activity,
    processes: int,
    threads: int,
    reports: list[WorkerReport],
    answers: list[tuple[int, int]],
    audit: Any,
    usage: Any,
    settled: bool,
    settle_seconds: float,
) -> BenchResult:
    total = WorkerReport.merged(reports)
    outcomes, errors = total.outcomes, total.errors
    latencies = sorted(total.latencies_ms)
    requests = len(latencies)
    seconds = (
        total.last_end - total.first_start
        if total.first_start is not None and total.last_end is not None
        else 0.0
    )
    contended = outcomes[Outcome.CONTENDED.value]
    failed = sum(errors.values())
    grabbed = len(answers)
    own_queries = total.own_queries
    cpu_client = total.cpu_seconds
    cpu_total = cpu_client + usage.redis_cpu + (usage.mysql_cpu or 0.0)

    def per_request(value: float | None) -> float | None:
        return None if value is None or not requests else round(value / requests, 3)

    def us_per_request(seconds: float | None) -> float | None:
        return None if seconds is None or not requests else round(1e6 * seconds / requests, 1)

    def capacity(us: float | None) -> float | None:
        return round(1e6 / us, 1) if us else None

    batches = sum(total.batch_sizes.values())
    redis_us = us_per_request(usage.redis_cpu)
    mysql_us = us_per_request(usage.mysql_cpu)
    hold_us = us_per_request(total.lock_hold_seconds) if total.lock_holds else None

    return BenchResult(
        strategy=config.strategy,
        safe=strategy_safe,
        activity_id=activity.pk,
        packets=config.packets,
        users=config.users,
        clicks=config.clicks,
        allocation=config.allocation,
        concurrency=processes * threads,
        processes=processes,
        threads_per_process=threads,
        requests=requests,
        grabbed=grabbed,
        grabbed_rows=audit.grabbed,
        outcomes=dict(sorted(outcomes.items())),
        errors=failed,
        error_messages=dict(errors.most_common(5)),
        seconds=round(seconds, 3),
        requests_per_s=round(requests / seconds, 1) if seconds else None,
        grabs_per_s=round(grabbed / seconds, 1) if seconds else None,
        # Share of clicks that got a final answer (not contended, not an error).
        success_rate=success_rate(requests=requests, contended=contended, failed=failed),
        # Share of the packets that could be grabbed (min(packets, users)) that were.
        fill_rate=share(grabbed, min(config.packets, config.users)),
        contended=contended,
        contended_share=share(contended, requests),
        oversold=audit.oversold,
        duplicates=audit.duplicates,
        mean_ms=round(sum(latencies) / requests, 3) if requests else None,
        p50_ms=_round(percentile(latencies, 0.50)),
        p95_ms=_round(percentile(latencies, 0.95)),
        p99_ms=_round(percentile(latencies, 0.99)),
        max_ms=_round(latencies[-1] if latencies else None),
        mysql_queries=usage.mysql_queries,
        mysql_queries_per_request=per_request(usage.mysql_queries),
        mysql_queries_per_request_own=per_request(own_queries),
        redis_commands=usage.redis_commands,
        redis_commands_per_request=per_request(usage.redis_commands),
        cpu_seconds=round(cpu_total, 3),
        cpu_seconds_client=round(cpu_client, 3),
        cpu_seconds_mysql=None if usage.mysql_cpu is None else round(usage.mysql_cpu, 3),
        cpu_seconds_redis=round(usage.redis_cpu, 3),
        cpu_seconds_per_1k_requests=round(1000 * cpu_total / requests, 3) if requests else None,
        client_cpu_us_per_request=us_per_request(cpu_client),
        redis_cpu_us_per_request=redis_us,
        redis_evalsha_us_per_request=us_per_request(usage.redis_evalsha_usec / 1e6),
        mysql_cpu_us_per_request=mysql_us,
        row_lock_wait_ms=usage.row_lock_time_ms,
        row_lock_waits=usage.row_lock_waits,
        row_lock_hold_us_per_request=hold_us,
        row_lock_hold_mean_ms=(
            round(1000 * total.lock_hold_seconds / total.lock_holds, 3)
            if total.lock_holds
            else None
        ),
        row_lock_hold_max_ms=(
            round(1000 * total.lock_hold_longest, 3) if total.lock_holds else None
        ),
        batch_sizes=dict(sorted(total.batch_sizes.items())),
        mean_batch=(
            round(sum(size * n for size, n in total.batch_sizes.items()) / batches, 2)
            if batches
            else None
        ),
        projected_per_redis_shard=capacity(redis_us) if usage.redis_evalsha_usec else None,
        projected_per_mysql_row=capacity(mysql_us) if usage.mysql_queries else None,
        projected_per_row_lock=capacity(hold_us),
        settled=settled,
        settle_seconds=round(settle_seconds, 3),
        audit_ok=audit.ok,
        violations=audit.violations,
        config=asdict(config),
        cpus=os.cpu_count(),
        finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
