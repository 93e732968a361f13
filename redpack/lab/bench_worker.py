"""One spawned bench process: its own Django setup, `threads` threads with a connection each.

Importing this module must not import Django models: a spawned process unpickles its target
before Django is set up, so everything Django-related is imported inside `main`.

Messages to the parent, on `results` (results.py): Ready once every thread is connected, then
one WorkerReport; or a Failure at any point.
"""

import os
import queue
import resource
import threading
import time
from dataclasses import dataclass
from typing import Any

from .results import Failure, Ready, WorkerReport

START_TIMEOUT = 120.0


@dataclass(frozen=True)
class WorkerSpec:
    settings_module: str
    settings_values: dict[str, Any]  # copied from the parent before anything connects
    activity_id: int
    strategy: str
    clicks: list[int]  # user ids, one entry per click
    threads: int
    first_slot: int  # this process's first slot in the shared progress counters


def main(spec: WorkerSpec, go: Any, results: Any, done_counts: Any) -> None:
    try:
        _setup(spec)
        report = _run(spec, go, results, done_counts)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which stops the run
        results.put(Failure(f"bench worker {os.getpid()} failed: {exc!r}"))
        return
    results.put(report)


def _setup(spec: WorkerSpec) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = spec.settings_module
    import django
    from django.conf import settings

    # Before setup: some apps open the connection handler while they load.
    for name, value in spec.settings_values.items():
        setattr(settings, name, value)
    django.setup()
    from django.db import connection

    wanted = spec.settings_values["DATABASES"]["default"]["NAME"]
    if connection.settings_dict["NAME"] != wanted:
        raise RuntimeError(f"connected to {connection.settings_dict['NAME']}, not {wanted}")
    from strategies import registry

    registry.get(spec.strategy)  # import and build the strategy before the clock starts


def _run(spec: WorkerSpec, go: Any, results: Any, done_counts: Any) -> WorkerReport:
    from django.db import connection

    from redpack import services
    from strategies.base import Outcome

    from .meters import mysql_session_questions

    work: queue.SimpleQueue[int] = queue.SimpleQueue()
    for user_id in spec.clicks:
        work.put(user_id)
    connected = threading.Barrier(spec.threads + 1)
    start = threading.Event()
    per_thread = [WorkerReport() for _ in range(spec.threads)]
    failures: list[str] = []

    def grab_loop(index: int) -> None:
        mine = per_thread[index]
        slot = spec.first_slot + index
        try:
            connection.ensure_connection()
            questions_before = mysql_session_questions()
        except Exception as exc:  # noqa: BLE001 - the process reports it and stops the run
            failures.append(repr(exc))
            return
        finally:
            connected.wait()
        start.wait()
        while True:
            try:
                user_id = work.get_nowait()
            except queue.Empty:
                break
            began = time.monotonic()
            try:
                result = services.activity_grab(activity_id=spec.activity_id, user_id=user_id)
            except Exception as exc:  # noqa: BLE001 - an unanswered grab is a figure, not a crash
                mine.errors[f"{type(exc).__name__}: {exc}"[:200]] += 1
            else:
                mine.outcomes[result.outcome.value] += 1
                if result.outcome is Outcome.GRABBED:
                    mine.answers.append((user_id, int(result.amount_cents or 0)))
            ended = time.monotonic()
            mine.latencies_ms.append((ended - began) * 1000)
            mine.first_start = began if mine.first_start is None else mine.first_start
            mine.last_end = ended
            done_counts[slot] += 1
        questions_after = mysql_session_questions()
        connection.close()
        mine.own_queries = None
        if questions_before is not None and questions_after is not None:
            mine.own_queries = questions_after - questions_before - 1  # the read counts itself
        mine.session_reads = 0 if questions_after is None else 1

    pool = [threading.Thread(target=grab_loop, args=(i,), daemon=True) for i in range(spec.threads)]
    for thread in pool:
        thread.start()
    connected.wait(timeout=START_TIMEOUT)
    if failures:
        raise RuntimeError(f"cannot connect: {failures[0]}")
    results.put(Ready(os.getpid()))
    if not go.wait(timeout=START_TIMEOUT):
        raise RuntimeError("the parent never gave the start signal")
    from strategies.combiner import batch_sizes, reset_batch_sizes
    from strategies.holds import holds, reset_holds

    reset_batch_sizes()
    reset_holds()
    cpu_before = _own_cpu()
    start.set()
    for thread in pool:
        thread.join()
    report = WorkerReport.merged(per_thread)
    report.cpu_seconds = _own_cpu() - cpu_before
    report.batch_sizes = batch_sizes()
    held = holds()
    report.lock_holds, report.lock_hold_seconds = held.transactions, held.seconds
    report.lock_hold_longest = held.longest
    return report


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
