import shlex
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from redpack.lab import missing_extra

try:
    from redpack.lab.compare import Compare, CompareConfig
except ModuleNotFoundError as exc:
    raise missing_extra(exc) from exc
from strategies import registry

DEFAULTS = CompareConfig()


class Command(BaseCommand):
    help = (
        "Compare every strategy (direct bench and Locust, hot and throughput) against this "
        "machine's ceilings; write reports/compare.md, .png and .json."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--strategies", default="", help="Comma-separated (default: all).")
        parser.add_argument("--concurrency", type=int, default=DEFAULTS.concurrency)
        parser.add_argument(
            "--batched-concurrency",
            type=int,
            default=DEFAULTS.batched_concurrency,
            help="The bench's grabs in flight for a strategy that combines them (one MySQL "
            "connection each).",
        )
        parser.add_argument("--bench-processes", type=int, default=DEFAULTS.bench_processes)
        parser.add_argument("--hot-users", type=int, default=DEFAULTS.hot_users)
        parser.add_argument("--hot-packets", type=int, default=DEFAULTS.hot_packets)
        parser.add_argument("--throughput-packets", type=int, default=DEFAULTS.throughput_packets)
        parser.add_argument(
            "--throughput-users",
            type=int,
            default=DEFAULTS.throughput_users,
            help="Grabs fired by the throughput runs, one per bench user.",
        )
        parser.add_argument(
            "--http-users",
            type=int,
            default=DEFAULTS.http_users,
            help="Distinct users of the HTTP throughput runs: more than a run sends, so that "
            "each request is a user's first grab.",
        )
        parser.add_argument(
            "--hot-seconds",
            type=int,
            default=DEFAULTS.hot_seconds,
            help="Cap of the Locust hot run (it ends once every user grabbed).",
        )
        parser.add_argument("--throughput-seconds", type=int, default=DEFAULTS.throughput_seconds)
        parser.add_argument(
            "--lone-grabs",
            type=int,
            default=DEFAULTS.lone_grabs,
            help="Grabs of the `bench lone` run, one at a time (0: skip it).",
        )
        parser.add_argument("--web-seconds", type=int, default=DEFAULTS.web_seconds)
        parser.add_argument(
            "--rounds",
            type=int,
            default=DEFAULTS.rounds,
            help="wrk's many-packets run and hot burst of each strategy (each with its pings "
            "beside it) this many times; the report keeps the median round.",
        )
        parser.add_argument("--ceiling-requests", type=int, default=DEFAULTS.ceiling_requests)
        parser.add_argument("--ceiling-queries", type=int, default=DEFAULTS.ceiling_queries)
        parser.add_argument("--web-workers", type=int, default=DEFAULTS.web_workers)
        parser.add_argument("--web-threads", type=int, default=DEFAULTS.web_threads)
        parser.add_argument("--port", type=int, default=DEFAULTS.port)
        parser.add_argument("--celery", choices=["auto", "on", "off"], default=DEFAULTS.celery)
        parser.add_argument("--skip-bench", action="store_true")
        parser.add_argument(
            "--skip-locust",
            action="store_true",
            help="No Locust runs (wrk's still run where wrk is installed).",
        )
        parser.add_argument(
            "--skip-http", action="store_true", help="No web server and no HTTP run at all."
        )
        parser.add_argument("--out-dir", type=Path, default=DEFAULTS.out_dir)

    def handle(self, *args: object, **options: object) -> None:
        names = [n for n in str(options["strategies"]).split(",") if n]
        unknown = sorted(set(names) - set(registry.names()))
        if unknown:
            raise CommandError(f"unknown strategies {unknown}; configured: {registry.names()}")
        keys = set(CompareConfig.__dataclass_fields__) - {"strategies", "command"}
        values = {k: options[k] for k in keys if k in options}
        try:
            config = CompareConfig(
                strategies=names,
                command=shlex.join(["manage.py", "compare", *sys.argv[2:]])
                if sys.argv[1:2] == ["compare"]
                else "manage.py compare",
                **values,  # type: ignore[arg-type]
            )
        except ValueError as exc:  # a setting out of its range: named as its option
            raise CommandError(f"--{exc}") from exc
        try:
            code = Compare(config, log=self.stdout.write).run()
        except RuntimeError as exc:  # a server compare needs did not start
            raise CommandError(str(exc)) from exc
        if code:
            raise SystemExit(code)
