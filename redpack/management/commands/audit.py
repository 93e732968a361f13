import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from redpack.audit import audit_activity
from redpack.models import Activity


class Command(BaseCommand):
    help = "Check the invariants of one or all activities; exit non-zero on any violation."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--activity", type=int, help="Audit only this activity id.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args: object, **options: Any) -> None:
        activities = Activity.objects.order_by("pk")
        if options["activity"] is not None:
            activities = activities.filter(pk=options["activity"])
            if not activities.exists():
                raise CommandError(f"activity {options['activity']} does not exist")
        reports = [audit_activity(activity) for activity in activities.iterator(chunk_size=500)]
        failed = [r for r in reports if not r.ok]
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "ok": not failed,
                        "activities": len(reports),
                        "violations": sum(len(r.violations) for r in reports),
                        "reports": [
                            {
                                "activity": r.activity_id,
                                "strategy": r.strategy,
                                "ok": r.ok,
                                "grabbed": r.grabbed,
                                "oversold": r.oversold,
                                "duplicates": r.duplicates,
                                "checks": r.checks,
                                "violations": r.violations,
                            }
                            for r in reports
                        ],
                    }
                )
            )
        else:
            for report in reports:
                mark = "ok" if report.ok else "VIOLATED"
                self.stdout.write(
                    f"activity {report.activity_id} ({report.strategy}): {mark}, "
                    f"{len(report.checks)} checks, {report.grabbed} grabbed"
                )
                for violation in report.violations:
                    self.stdout.write(f"  - {violation}")
            self.stdout.write(f"{len(reports)} activities audited, {len(failed)} with violations")
        if failed:
            raise SystemExit(1)
