import csv
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.management.base import BaseCommand, CommandParser
from rest_framework_simplejwt.tokens import AccessToken


class Command(BaseCommand):
    help = "Create (or reuse) N bench users and write username,authorization to a CSV file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, required=True)
        parser.add_argument("--output", required=True, help="CSV file to write.")
        parser.add_argument("--prefix", default="bench")
        parser.add_argument("--ttl", type=int, default=24 * 3600, help="Token lifetime, seconds.")

    def handle(self, *args: object, **options: object) -> None:
        User = get_user_model()
        count, prefix = int(options["count"]), str(options["prefix"])  # type: ignore[call-overload]
        names = [f"{prefix}{i:06d}" for i in range(count)]
        existing = set(User.objects.filter(username__in=names).values_list("username", flat=True))
        unusable = make_password(None)  # bench users log in only with the token written here
        User.objects.bulk_create(
            [User(username=n, password=unusable) for n in names if n not in existing],
            batch_size=1000,
        )
        users = User.objects.filter(username__in=names).order_by("username")
        ttl = timedelta(seconds=int(options["ttl"]))  # type: ignore[call-overload]
        with open(str(options["output"]), "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["username", "authorization"])
            for user in users.iterator(chunk_size=1000):
                token = AccessToken.for_user(user)
                token.set_exp(lifetime=ttl)
                writer.writerow([user.username, f"Bearer {token}"])
        self.stdout.write(
            f"{count} users ({count - len(existing)} new) written to {options['output']}"
        )
