"""10,000 activities expiring in the same second: how fast are they refunded, exactly once, and
what does the storm do to the grabs of a live activity meanwhile?"""

import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from redpack import expiry, services
from redpack.audit import audit_activity
from redpack.lab.stats import percentile
from redpack.lab.users import bench_sender, bench_users_ensure
from redpack.models import Activity, Refund


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--activities", type=int, default=10_000)
        parser.add_argument("--strategy", default="pessimistic")
        parser.add_argument("--workers", type=int, default=8, help="Refund worker threads.")
        parser.add_argument("--grabbers", type=int, default=8, help="Threads grabbing meanwhile.")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: object, **options: Any) -> None:
        count, strategy = options["activities"], options["strategy"]
        sender = bench_sender()
        grabber_ids, _ = bench_users_ensure(count=20_000, prefix="expirybench")
        self.stderr.write(f"sending {count} activities ({strategy}) ...")

        def send(_: int) -> int:
            try:
                return services.activity_send(
                    sender_id=sender.pk,
                    total_amount=Decimal("1.00"),
                    total_count=2,
                    strategy=strategy,
                    expires_in=3600,
                ).pk
            finally:
                connection.close()

        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(send, range(count)))
        # All of them expire in the same second, in MySQL and in the expiry ZSET.
        due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
        Activity.objects.filter(pk__in=ids).update(expires_at=due)
        expiry.register(list(Activity.objects.filter(pk__in=ids)))
        hot = services.activity_send(
            sender_id=sender.pk,
            total_amount=Decimal("20000.00"),
            total_count=10_000,
            strategy=strategy,
            expires_in=3600,
        )

        latencies: dict[str, list[float]] = {"before": [], "during": []}
        phase = {"name": "before"}
        stop = threading.Event()
        users = iter(grabber_ids)
        users_lock = threading.Lock()

        def grab_loop() -> None:
            try:
                while not stop.is_set():
                    with users_lock:
                        user_id = next(users, None)
                    if user_id is None:
                        return
                    started = time.perf_counter()
                    services.activity_grab(activity_id=hot.pk, user_id=user_id)
                    latencies[phase["name"]].append((time.perf_counter() - started) * 1000)
            finally:
                connection.close()

        grabbers = [threading.Thread(target=grab_loop) for _ in range(options["grabbers"])]
        for thread in grabbers:
            thread.start()
        while datetime.now(UTC) < due:
            time.sleep(0.01)
        phase["name"] = "during"
        self.stderr.write("refunding ...")
        started = time.perf_counter()

        def refund_worker() -> int:
            done = 0
            try:
                while batch := expiry.claim_due(batch=100, lease_seconds=60):
                    for activity_id in batch:
                        services.activity_expire(activity_id=activity_id)
                        done += 1
                return done
            finally:
                connection.close()

        with ThreadPoolExecutor(options["workers"]) as pool:
            refunded = sum(pool.map(lambda _: refund_worker(), range(options["workers"])))
        seconds = time.perf_counter() - started
        stop.set()
        for thread in grabbers:
            thread.join()

        refunds = Refund.objects.filter(activity_id__in=ids).count()
        violations = [
            v
            for a in Activity.objects.filter(pk__in=ids).iterator(chunk_size=1000)
            for v in audit_activity(a).violations
        ]
        result = {
            "strategy": strategy,
            "activities": count,
            "refund_calls": refunded,
            "refund_records": refunds,
            "seconds": round(seconds, 2),
            "refunds_per_s": round(refunds / seconds, 1),
            "grab_p50_ms_before": round(statistics.median(latencies["before"] or [0]), 2),
            "grab_p99_ms_before": _ms(percentile(latencies["before"], 0.99)),
            "grab_p50_ms_during": round(statistics.median(latencies["during"] or [0]), 2),
            "grab_p99_ms_during": _ms(percentile(latencies["during"], 0.99)),
            "grabs_during": len(latencies["during"]),
            "audit_ok": not violations and refunds == count,
        }
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key:>22}  {value}")
        if not result["audit_ok"]:
            raise CommandError(f"{len(violations)} violations, {refunds} of {count} refunded")


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
