import json
import time
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError, CommandParser

from redpack.allocation import Allocation
from redpack.errors import RedpackError
from redpack.lab import missing_extra

try:
    from redpack.lab.bench import DEFAULT_PROCESSES, BenchConfig, BenchError, run_bench
    from redpack.lab.results import BenchResult
except ModuleNotFoundError as exc:
    raise missing_extra(exc) from exc
from redpack.money import to_cents
from strategies import registry

SHOWN = [
    ("strategy", "strategy"),
    ("requests", "requests"),
    ("grabbed", "grabbed (answers)"),
    ("seconds", "seconds"),
    ("requests_per_s", "requests/s"),
    ("grabs_per_s", "grabs/s"),
    ("success_rate", "success rate"),
    ("contended", "contended"),
    ("errors", "errors"),
    ("oversold", "oversold"),
    ("duplicates", "duplicates"),
    ("p50_ms", "p50 ms"),
    ("p95_ms", "p95 ms"),
    ("p99_ms", "p99 ms"),
    ("mysql_queries_per_request", "MySQL queries/request"),
    ("mysql_queries_per_request_own", "  of which this bench's"),
    ("redis_commands_per_request", "Redis commands/request"),
    ("cpu_seconds_per_1k_requests", "CPU s/1k requests"),
    ("client_cpu_us_per_request", "client CPU µs/request"),
    ("redis_cpu_us_per_request", "Redis CPU µs/request"),
    ("redis_evalsha_us_per_request", "  of which in EVALSHA"),
    ("mysql_cpu_us_per_request", "MySQL CPU µs/request"),
    ("row_lock_wait_ms", "InnoDB row-lock wait ms"),
    ("row_lock_hold_us_per_request", "row-lock hold µs/request"),
    ("row_lock_hold_mean_ms", "  mean per transaction ms"),
    ("mean_batch", "mean batch"),
    ("batch_sizes", "batch sizes (size: batches)"),
    ("projected_per_redis_shard", "projected grabs/s per Redis shard"),
    ("projected_per_mysql_row", "projected grabs/s per MySQL row"),
    ("projected_per_row_lock", "  by its lock hold"),
    ("settle_seconds", "settle (persist lag) s"),
    ("audit_ok", "audit ok"),
]


class Command(BaseCommand):
    help = (
        "Drive one strategy with concurrent grabs through services.activity_grab (no HTTP), "
        "audit, and report throughput, latency and resources. Exits non-zero when the audit fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--strategy", required=True, help="A name from REDPACK_STRATEGIES.")
        parser.add_argument("--packets", type=int, default=100)
        parser.add_argument("--users", type=int, default=10_000, help="Grabbers, each once.")
        parser.add_argument("--concurrency", type=int, default=64, help="Grabs in flight.")
        parser.add_argument(
            "--processes",
            type=int,
            default=DEFAULT_PROCESSES,
            help="Worker processes (default: one per core); threads = C / processes.",
        )
        parser.add_argument("--clicks", type=int, default=1, help="Grabs per user (2: double).")
        parser.add_argument(
            "--allocation",
            default=Allocation.DOUBLE_AVERAGE.value,
            choices=[a.value for a in Allocation],
        )
        parser.add_argument(
            "--amount", type=Decimal, help="Total amount (default: 1.00 per packet)."
        )
        parser.add_argument("--settle-timeout", type=float, default=60.0)
        parser.add_argument("--prefix", default="bench", help="Bench user name prefix.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args: object, **options: object) -> None:
        name = str(options["strategy"])
        if name not in registry.names():
            raise CommandError(f"unknown strategy {name!r}; configured: {registry.names()}")
        for option in ("packets", "users", "concurrency", "processes", "clicks"):
            if int(options[option]) < 1:  # type: ignore[call-overload]
                raise CommandError(f"--{option} must be at least 1")
        amount = options["amount"]
        config = BenchConfig(
            strategy=name,
            packets=int(options["packets"]),  # type: ignore[call-overload]
            users=int(options["users"]),  # type: ignore[call-overload]
            concurrency=int(options["concurrency"]),  # type: ignore[call-overload]
            processes=int(options["processes"]),  # type: ignore[call-overload]
            clicks=int(options["clicks"]),  # type: ignore[call-overload]
            allocation=str(options["allocation"]),
            amount_cents=to_cents(amount) if amount is not None else None,  # type: ignore[arg-type]
            settle_timeout=float(options["settle_timeout"]),  # type: ignore[arg-type]
            user_prefix=str(options["prefix"]),
        )
        as_json = bool(options["json"])
        show_progress = not as_json and self.stdout.isatty()
        if not as_json and not registry.get(name).safe:
            self.stdout.write(f"note: {name} is unsafe; allowed for this bench run only")
        try:
            result = run_bench(config, progress=self._progress_bar() if show_progress else None)
        except RedpackError as exc:
            hint = " (raise REDPACK_MAX_COUNT for larger activities)" if exc.field else ""
            raise CommandError(f"cannot send the bench activity: {exc.message}{hint}") from exc
        except BenchError as exc:
            raise CommandError(str(exc)) from exc
        if as_json:
            self.stdout.write(json.dumps(result.to_dict()))
        else:
            self._table(result)
        if not result.audit_ok or result.errors:
            raise SystemExit(1)

    def _progress_bar(self):  # type: ignore[no-untyped-def]
        started: list[float] = []  # the first call comes right after the start signal

        def show(done: int, total: int) -> None:
            if not started:
                started.append(time.monotonic())
            width = 30
            filled = width * done // max(total, 1)
            rate = done / max(time.monotonic() - started[0], 1e-3)
            end = "\n" if done >= total else ""
            self.stdout.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {rate:,.0f}/s",
                ending=end,
            )
            self.stdout.flush()

        return show

    def _table(self, result: BenchResult) -> None:
        width = max(len(label) for _, label in SHOWN)
        for key, label in SHOWN:
            value = getattr(result, key)
            shown = "n/a" if value is None else value
            self.stdout.write(f"{label:<{width}}  {shown}")
        for violation in result.violations:
            self.stdout.write(f"  VIOLATION: {violation}")
        for message, count in result.error_messages.items():
            self.stdout.write(f"  error ×{count}: {message}")
