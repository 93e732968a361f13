from django.core.management.base import BaseCommand, CommandError, CommandParser

from redpack import selectors
from redpack.models import Activity
from strategies import registry
from strategies.base import NotRebuildable


class Command(BaseCommand):
    help = (
        "Rebuild the Redis state of the Redis strategies from MySQL, the source of truth "
        "(after Redis lost its data). Every open activity, or one. Safe to run twice."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--activity", type=int, help="Rebuild only this activity id.")
        parser.add_argument(
            "--if-lost",
            action="store_true",
            help="Only when open activities have lost their Redis state (what /healthz checks); "
            "`make run` runs this at start, so an embedded Redis that forgot is rebuilt.",
        )

    def handle(
        self, *args: object, activity: int | None, if_lost: bool = False, **options: object
    ) -> None:
        if if_lost:
            lost = registry.state_lost()
            if lost is None:
                self.stdout.write("the Redis state of every open activity is there")
                return
            self.stdout.write(lost)
        redis_strategies = {
            name: strategy
            for name in registry.names()
            if (strategy := registry.get(name)).rebuildable
        }
        activities = Activity.objects.filter(strategy__in=redis_strategies).order_by("pk")
        if activity is not None:
            activities = Activity.objects.filter(pk=activity)
            name = activities.values_list("strategy", flat=True).first()
            if name is None:
                raise CommandError(f"activity {activity} does not exist")
            if name not in redis_strategies:
                raise CommandError(f"activity {activity} uses {name!r}, which keeps no Redis state")
        else:
            # Older state would expire at once: its keys live until expiry plus the grace.
            activities = selectors.activities_with_live_state(strategies=redis_strategies)
        rebuilt, refused = 0, 0
        for activity_id, name in activities.values_list("pk", "strategy").iterator():
            try:
                redis_strategies[name].rebuild(activity_id=activity_id)
            except NotRebuildable as exc:
                self.stderr.write(str(exc))
                refused += 1
                continue
            rebuilt += 1
        self.stdout.write(f"rebuilt the Redis state of {rebuilt} activities")
        if refused:
            raise CommandError(f"{refused} activities not rebuilt (see above)")
