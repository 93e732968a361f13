from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from redpack import services
from redpack.ledger import wallets_top_up
from redpack.models import Activity, ActivityStatus
from strategies import registry

DEMO_SENDER = "demo"


class Command(BaseCommand):
    help = (
        "Give the admin something to show: one open demo activity per strategy allowed here, "
        "each grabbed by a few demo users. Idempotent: an open demo activity is kept, not doubled."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--packets", type=int, default=20)
        parser.add_argument("--amount", default="100.00")
        parser.add_argument("--grabs", type=int, default=3, help="Demo users who grab each one.")

    def handle(self, *args: object, **options: object) -> None:
        User = get_user_model()
        unusable = make_password(None)
        sender, _ = User.objects.get_or_create(
            username=DEMO_SENDER, defaults={"password": unusable}
        )
        grabbers = [
            User.objects.get_or_create(username=f"demo{i}", defaults={"password": unusable})[0]
            for i in range(1, int(options["grabs"]) + 1)  # type: ignore[call-overload]
        ]
        wallets_top_up(user_ids=[sender.pk, *(u.pk for u in grabbers)], memo="demo users")
        for name in registry.names():
            if not registry.allowed(name):
                reason = registry.unavailable_reason(name)
                self.stdout.write(f"{name}: skipped ({reason})")
                continue
            activity = Activity.objects.filter(
                sender=sender,
                strategy=name,
                status=ActivityStatus.OPEN,
                expires_at__gt=timezone.now(),
            ).first()
            if activity is None:
                activity = services.activity_send(
                    sender_id=sender.pk,
                    total_amount=Decimal(str(options["amount"])),
                    total_count=int(options["packets"]),  # type: ignore[call-overload]
                    strategy=name,
                    expires_in=settings.REDPACK_MAX_EXPIRES_IN,
                )
                created = "sent"
            else:
                created = "kept"
            for user in grabbers:
                services.activity_grab(activity_id=activity.pk, user_id=user.pk)
            self.stdout.write(f"{name}: demo activity {activity.pk} {created}")
