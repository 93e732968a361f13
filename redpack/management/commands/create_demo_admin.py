from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from redpack.ledger import wallets_top_up


class Command(BaseCommand):
    help = (
        "Create the demo admin user that `make run` prints, once: an existing user of that name "
        "is left as it is (its password is never reset). Its wallet is topped up to "
        "REDPACK_STARTING_BALANCE."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default="admin")

    def handle(self, *args: object, **options: object) -> None:
        User = get_user_model()
        username = str(options["username"])
        admin = User.objects.filter(username=username).first()
        if admin is not None:
            self.stdout.write(f"demo admin {username} exists: left as it is")
        else:
            admin = User.objects.create_superuser(
                username=username, password=str(options["password"])
            )
            self.stdout.write(f"demo admin created: {username}")
        wallets_top_up(user_ids=[admin.pk], memo="demo admin")
