from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from redpack import ledger
from redpack.errors import RedpackError


class Command(BaseCommand):
    help = (
        "Deposit an amount from the platform's funding account into each named user's wallet "
        "(one journal entry per user), or top their wallets up to it with --top-up."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("usernames", nargs="+")
        parser.add_argument("--amount", required=True, help="Decimal string, e.g. 100.00.")
        parser.add_argument(
            "--top-up",
            action="store_true",
            help="Deposit only what each wallet lacks to hold the amount.",
        )
        parser.add_argument("--memo", default="manage.py deposit")

    def handle(self, *args: object, **options: object) -> None:
        names = [str(name) for name in options["usernames"]]  # type: ignore[attr-defined]
        users = dict(
            get_user_model().objects.filter(username__in=names).values_list("username", "pk")
        )
        unknown = [name for name in names if name not in users]
        if unknown:
            raise CommandError(f"no such user: {', '.join(unknown)}")
        amount, memo = str(options["amount"]), str(options["memo"])
        try:
            ledger.deposit_cents(amount)
            if options["top_up"]:
                ids = [users[name] for name in names]
                topped = ledger.wallets_top_up(user_ids=ids, to=amount, memo=memo)
                self.stdout.write(f"{topped} of {len(ids)} wallets topped up to {amount}")
                return
            for name in names:
                ledger.wallet_deposit(user_id=users[name], amount=amount, memo=memo)
        except RedpackError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"{amount} deposited into {len(names)} wallets")
