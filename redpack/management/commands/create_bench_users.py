from datetime import timedelta

from django.core.management.base import BaseCommand, CommandParser

from redpack.lab.users import bench_users_ensure, bench_users_write_csv


class Command(BaseCommand):
    help = "Create (or reuse) N bench users and write username,authorization to a CSV file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, required=True)
        parser.add_argument("--output", required=True, help="CSV file to write.")
        parser.add_argument("--prefix", default="bench")
        parser.add_argument("--ttl", type=int, default=24 * 3600, help="Token lifetime, seconds.")

    def handle(self, *args: object, **options: object) -> None:
        count = int(options["count"])  # type: ignore[call-overload]
        ids, created = bench_users_ensure(count=count, prefix=str(options["prefix"]))
        ttl = timedelta(seconds=int(options["ttl"]))  # type: ignore[call-overload]
        bench_users_write_csv(user_ids=ids, path=str(options["output"]), ttl=ttl)
        self.stdout.write(f"{count} users ({created} new) written to {options['output']}")
