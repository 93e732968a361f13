from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from redpack.models import Activity, ActivityStatus
from strategies import registry
from strategies.redis_state import RedisStateStrategy


class Command(BaseCommand):
    help = (
        "Rebuild the Redis state of the Redis strategies from MySQL, the source of truth "
        "(after Redis lost its data). Every open activity, or one. Safe to run twice."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--activity", type=int, help="Rebuild only this activity id.")

    def handle(self, *args: object, activity: int | None, **options: object) -> None:
        redis_strategies = {
            name: candidate
            for name in registry.names()
            if isinstance(candidate := registry.get(name), RedisStateStrategy)
        }
        activities = Activity.objects.filter(strategy__in=redis_strategies).order_by("pk")
        if activity is not None:
            activities = Activity.objects.filter(pk=activity)
            strategy = activities.values_list("strategy", flat=True).first()
            if strategy is None:
                raise CommandError(f"activity {activity} does not exist")
            if strategy not in redis_strategies:
                raise CommandError(
                    f"activity {activity} uses {strategy!r}, which keeps no Redis state"
                )
        else:
            # Older state would expire at once: its keys live until expiry plus the grace.
            grace = timedelta(seconds=settings.REDPACK_REDIS_STATE_GRACE)
            activities = activities.filter(
                status=ActivityStatus.OPEN, expires_at__gt=timezone.now() - grace
            )
        rebuilt = 0
        for activity_id, name in activities.values_list("pk", "strategy").iterator():
            redis_strategies[name].install(activity_id)
            rebuilt += 1
        self.stdout.write(f"rebuilt the Redis state of {rebuilt} activities")
