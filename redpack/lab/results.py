"""What the direct bench's processes report and what one bench run measures, as typed records.

A bench worker sends `Ready`, then one `WorkerReport` (or a `Failure` at any point) to the
parent, through a multiprocessing queue (these are plain picklable dataclasses). The parent folds
the reports into one `BenchResult`; `BenchResult.to_dict()` is the JSON that `manage.py bench
--json` prints and `make compare` collects into reports/compare.json.
"""

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class Failure:
    message: str


@dataclass
class WorkerReport:
    """One bench process's (or one of its threads') clicks, answers and costs."""

    latencies_ms: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    answers: list[tuple[int, int]] = field(default_factory=list)  # (user, cents) of `grabbed`
    own_queries: int | None = 0  # MySQL statements its threads sent; None when unknown
    session_reads: int = 0  # statements spent measuring that
    cpu_seconds: float = 0.0
    batch_sizes: Counter[int] = field(default_factory=Counter)  # strategies/combiner.py
    # Grab transactions that held the activity row, and for how long (strategies/holds.py).
    lock_holds: int = 0
    lock_hold_seconds: float = 0.0
    lock_hold_longest: float = 0.0
    # time.monotonic is CLOCK_MONOTONIC: one clock for every process on the machine.
    first_start: float | None = None
    last_end: float | None = None

    def add(self, other: "WorkerReport") -> None:
        self.latencies_ms.extend(other.latencies_ms)
        self.outcomes.update(other.outcomes)
        self.errors.update(other.errors)
        self.answers.extend(other.answers)
        if self.own_queries is None or other.own_queries is None:
            self.own_queries = None
        else:
            self.own_queries += other.own_queries
        self.session_reads += other.session_reads
        self.cpu_seconds += other.cpu_seconds
        self.batch_sizes.update(other.batch_sizes)
        self.lock_holds += other.lock_holds
        self.lock_hold_seconds += other.lock_hold_seconds
        self.lock_hold_longest = max(self.lock_hold_longest, other.lock_hold_longest)
        if other.first_start is not None:
            self.first_start = min(self.first_start or other.first_start, other.first_start)
        if other.last_end is not None:
            self.last_end = max(self.last_end or other.last_end, other.last_end)

    @classmethod
    def merged(cls, reports: list["WorkerReport"]) -> "WorkerReport":
        total = cls()
        for report in reports:
            total.add(report)
        return total


@dataclass(frozen=True)
class BenchResult:
    """One run of the direct bench (redpack/lab/bench.py)."""

    strategy: str
    safe: bool
    activity_id: int
    packets: int
    users: int
    clicks: int
    allocation: str
    concurrency: int
    processes: int
    threads_per_process: int
    requests: int
    grabbed: int
    grabbed_rows: int
    outcomes: dict[str, int]
    errors: int
    error_messages: dict[str, int]
    seconds: float
    requests_per_s: float | None
    grabs_per_s: float | None
    success_rate: float | None  # redpack/lab/stats.py
    fill_rate: float | None  # share of the packets that could be grabbed that were
    contended: int
    contended_share: float | None
    oversold: int
    duplicates: int
    mean_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    mysql_queries: int | None
    mysql_queries_per_request: float | None
    mysql_queries_per_request_own: float | None
    redis_commands: int
    redis_commands_per_request: float | None
    cpu_seconds: float
    cpu_seconds_client: float
    cpu_seconds_mysql: float | None
    cpu_seconds_redis: float
    cpu_seconds_per_1k_requests: float | None
    # Cost per request (grab attempt), in µs: the bench processes' CPU; Redis's CPU and the
    # time its EVALSHA calls took inside Redis (INFO commandstats); the MySQL server's CPU;
    # and InnoDB's row-lock waits (Innodb_row_lock_time, ms, over the run).
    client_cpu_us_per_request: float | None
    redis_cpu_us_per_request: float | None
    redis_evalsha_us_per_request: float | None
    mysql_cpu_us_per_request: float | None
    row_lock_wait_ms: int | None
    row_lock_waits: int | None
    # How long grab transactions held the activity row (strategies/holds.py), from the
    # statement that locked it to COMMIT by the client's clock (an upper bound: a loaded client
    # wakes late after each statement): µs per request, mean and longest per transaction.
    row_lock_hold_us_per_request: float | None
    row_lock_hold_mean_ms: float | None
    row_lock_hold_max_ms: float | None
    # Batches of the combiner (strategies/combiner.py): size -> batches; empty when unbatched.
    batch_sizes: dict[int, int]
    mean_batch: float | None
    # Grabs/s one Redis shard / one activity row could take if the client side were free:
    # 1e6 / (Redis CPU µs per request), 1e6 / (MySQL CPU µs per request); and the row's bound
    # from its lock: 1e6 / (µs the row is held per request).
    projected_per_redis_shard: float | None
    projected_per_mysql_row: float | None
    projected_per_row_lock: float | None
    settled: bool
    settle_seconds: float
    audit_ok: bool
    violations: list[str]
    config: dict[str, Any]
    cpus: int | None
    finished_at: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
