"""How often each strategy turns grabbers away, and how fast it answers, under one burst.

Drives every click at once through tests/contract/harness.py (one thread and one database
connection per click), audits the activity, and prints per strategy: answers per second,
grabs per second, the share of `contended` answers and the packets left although somebody was
turned away. Indicative only: it runs client and servers on one machine.

    DJANGO_SETTINGS_MODULE=redpack.settings .venv/bin/python scripts/contention.py \
        --users 200 --packets 50 --clicks 2 --rounds 3 optimistic preallocated

Uses DATABASE_URL (migrated: `manage.py migrate`) and REDIS_URL like the web server does, and
adds users and activities there.
"""

import argparse
import os
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402

from redpack import services  # noqa: E402
from redpack.audit import audit_activity  # noqa: E402
from strategies import registry  # noqa: E402
from strategies.base import Outcome  # noqa: E402
from tests.contract.harness import grab_concurrently  # noqa: E402


def bench_users(count: int) -> list[int]:
    User = get_user_model()
    names = [f"contention{i}" for i in range(count + 1)]
    existing = set(User.objects.filter(username__in=names).values_list("username", flat=True))
    User.objects.bulk_create([User(username=n) for n in names if n not in existing])
    return list(
        User.objects.filter(username__in=names).order_by("username").values_list("pk", flat=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategies", nargs="*", default=registry.names())
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--packets", type=int, default=50)
    parser.add_argument("--clicks", type=int, default=2, help="simultaneous clicks per user")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    sender, *users = bench_users(args.users)
    print(
        f"{args.users} users × {args.clicks} clicks on {args.packets} packets, "
        f"{args.rounds} rounds per strategy"
    )
    print(
        f"{'strategy':<26}{'answers/s':>10}{'grabs/s':>9}{'contended':>11}"
        f"{'left behind':>13}  audit"
    )
    for name in args.strategies:
        outcomes: Counter[Outcome] = Counter()
        elapsed = 0.0
        left_behind = 0
        audits = []
        for _ in range(args.rounds):
            activity = services.activity_send(
                sender_id=sender,
                total_amount=Decimal(args.packets),
                total_count=args.packets,
                strategy=name,
                expires_in=3600,
            )
            started = time.perf_counter()
            answers = grab_concurrently(activity.pk, users, clicks_per_user=args.clicks)
            registry.get(name).settle(activity_id=activity.pk, timeout=60)
            elapsed += time.perf_counter() - started
            outcomes.update(a.result.outcome for a in answers)
            activity.refresh_from_db()
            if any(a.result.outcome is Outcome.CONTENDED for a in answers):
                left_behind += activity.surplus_count
            report = audit_activity(activity)
            audits.append("ok" if report.ok else f"VIOLATED (oversold {report.oversold})")
        answered = sum(outcomes.values())
        print(
            f"{name:<26}{answered / elapsed:>10.0f}{outcomes[Outcome.GRABBED] / elapsed:>9.0f}"
            f"{outcomes[Outcome.CONTENDED] / answered:>11.1%}{left_behind:>13}  "
            f"{', '.join(sorted(set(audits)))}"
        )


if __name__ == "__main__":
    main()
