"""The bench's typed records (redpack/lab/results.py)."""

import json
import pickle
from collections import Counter

from redpack.lab.results import WorkerReport


def test_worker_reports_fold_into_one():
    first = WorkerReport(
        latencies_ms=[1.0, 2.0],
        outcomes=Counter(grabbed=1, sold_out=1),
        answers=[(7, 100)],
        own_queries=4,
        session_reads=1,
        cpu_seconds=0.5,
        first_start=10.0,
        last_end=12.0,
    )
    second = WorkerReport(
        latencies_ms=[3.0],
        outcomes=Counter(contended=1),
        errors=Counter({"boom": 1}),
        own_queries=None,
        cpu_seconds=0.25,
        first_start=9.0,
        last_end=11.0,
    )
    total = WorkerReport.merged([first, second])
    assert total.latencies_ms == [1.0, 2.0, 3.0]
    assert total.outcomes == Counter(grabbed=1, sold_out=1, contended=1)
    assert total.errors == Counter({"boom": 1}) and total.answers == [(7, 100)]
    assert total.own_queries is None  # one process could not count its own
    assert (total.first_start, total.last_end, total.cpu_seconds) == (9.0, 12.0, 0.75)


def test_a_report_crosses_a_process_boundary_and_becomes_json():
    report = WorkerReport(latencies_ms=[1.5], outcomes=Counter(grabbed=1), answers=[(1, 2)])
    again = pickle.loads(pickle.dumps(report))
    assert again == report
    assert json.loads(json.dumps(again.outcomes)) == {"grabbed": 1}
