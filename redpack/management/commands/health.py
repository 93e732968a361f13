from django.core.management.base import BaseCommand, CommandError, CommandParser

from redpack import health


class Command(BaseCommand):
    help = (
        "The /healthz probes, for health checks that run a command (compose): prints each and "
        "exits 1 when the service is down, or when a check named with --require is not ok "
        "(`--require worker`: a worker ran beat's heartbeat lately, so beat, the broker and a "
        "worker are alive)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--require",
            action="append",
            default=[],
            choices=["database", "redis", "broker", "worker"],
            help="a check that must be ok (repeatable)",
        )

    def handle(self, *args: object, **options: object) -> None:
        age = health.heartbeat_age()
        results = health.checks(age)
        status, _code = health.judge(results)
        self.stdout.write(" ".join(f"{name}={result}" for name, result in results.items()))
        failing = [name for name in options["require"] if results[name] != "ok"]  # type: ignore[attr-defined]
        if status == "down" or failing:
            raise CommandError(f"{status}; not ok: {', '.join(failing) or 'database or redis'}")
