import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from redpack import shards
from redpack.audit import AuditReport, Checks, audit_activity, audit_books
from redpack.models import Activity


class Command(BaseCommand):
    help = (
        "Check the invariants of one or all activities and the books; exit non-zero on any "
        "violation."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--activity", type=int, action="append", help="Audit only this activity id (repeat)."
        )
        parser.add_argument(
            "--answers",
            help='JSON file {"<activity id>": [[user_id, amount_cents], ...]}: every `grabbed` '
            "answer a client received; each listed activity is also checked against them.",
        )
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")
        parser.add_argument(
            "--drained",
            action="store_true",
            help="The crediting task has caught up: every grab must be credited.",
        )

    def handle(self, *args: object, **options: Any) -> None:
        wanted = set(options["activity"] or [])
        answers = self._answers(options["answers"]) if options["answers"] else {}
        reports: list[AuditReport] = []
        shard_of: dict[int, str] = {}  # activity -> the database it is on (every shard in turn)
        for alias in shards.each():
            activities = Activity.objects.order_by("pk")
            if wanted:
                activities = activities.filter(pk__in=wanted)
            for activity in activities.iterator(chunk_size=500):
                reports.append(audit_activity(activity, answers=answers.get(activity.pk)))
                shard_of[activity.pk] = alias
        missing = wanted - shard_of.keys()
        if missing:
            raise CommandError(f"activity {sorted(missing)[0]} does not exist")
        failed = [r for r in reports if not r.ok]
        books = audit_books(drained=options["drained"])
        per_shard = {
            alias: {
                "activities": sum(shard_of[r.activity_id] == alias for r in reports),
                "failed": sum(shard_of[r.activity_id] == alias for r in failed),
            }
            for alias in shards.each()
        }
        if options["json"]:
            body = {
                "ok": not failed and books.ok,
                "activities": len(reports),
                "violations": sum(len(r.violations) for r in reports),
                "shards": per_shard,
                "reports": [
                    {
                        "activity": r.activity_id,
                        "shard": shard_of[r.activity_id],
                        "strategy": r.strategy,
                        "ok": r.ok,
                        "grabbed": r.grabbed,
                        "oversold": r.oversold,
                        "duplicates": r.duplicates,
                        "uncredited": r.uncredited,
                        "checks": r.checks,
                        "violations": r.violations,
                    }
                    for r in reports
                ],
                "books": {
                    "ok": books.ok,
                    "entries": books.entries,
                    "accounts": books.accounts,
                    "uncredited": books.uncredited,
                    "checks": books.checks,
                    "violations": books.violations,
                },
            }
            self.stdout.write(json.dumps(body))
        else:
            for report in reports:
                head = f"activity {report.activity_id} ({report.strategy})"
                self._write(head, report, f"{report.grabbed} grabbed")
            if shards.enabled():
                for alias, counts in per_shard.items():
                    self.stdout.write(
                        f"{alias}: {counts['activities']} activities audited, "
                        f"{counts['failed']} with violations"
                    )
            self.stdout.write(f"{len(reports)} activities audited, {len(failed)} with violations")
            self._write(
                "books",
                books,
                f"{books.entries} entries, {books.accounts} accounts, "
                f"{books.uncredited} grabs not credited yet",
            )
        if failed or not books.ok:
            raise SystemExit(1)

    def _write(self, head: str, result: Checks, tail: str) -> None:
        mark = "ok" if result.ok else "VIOLATED"
        self.stdout.write(f"{head}: {mark}, {len(result.checks)} checks, {tail}")
        for violation in result.violations:
            self.stdout.write(f"  - {violation}")

    @staticmethod
    def _answers(path: object) -> dict[int, list[tuple[int, int]]]:
        try:
            raw = json.loads(Path(str(path)).read_text())
            return {
                int(activity): [(int(user), int(cents)) for user, cents in told]
                for activity, told in raw.items()
            }
        except (OSError, ValueError, TypeError) as exc:
            raise CommandError(f"cannot read answers from {path}: {exc}") from exc
