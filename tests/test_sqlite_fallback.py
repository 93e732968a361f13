"""The embedded fallback's database: SQLite with IMMEDIATE transactions keeps grabs exact.

Runs in a child process (this test run is bound to MariaDB) on a fresh SQLite file and the
tests' Redis database, through the real services, threads and the auditor, for every strategy
that writes the database before it answers (the async ones need a worker).
"""

import os
import subprocess
import sys

from django.conf import settings

from .servers import ROOT

SCRIPT = r"""
import threading
from decimal import Decimal

import django

django.setup()
from django.core.management import call_command
from django.contrib.auth import get_user_model
from django.db import connection, connections

from redpack import ledger, services
from redpack.audit import audit_activity, audit_books
from redpack.models import Activity
from strategies import registry

call_command("migrate", verbosity=0)
assert connection.vendor == "sqlite"
User = get_user_model()
users = [User.objects.create(username=f"u{i}") for i in range(41)]
sender, grabbers = users[0], users[1:]
ledger.wallets_top_up(user_ids=[sender.pk], memo="sqlite sender")

# Every strategy that writes before it answers, through the same two activities.
names = [
    n for n in registry.names() if registry.allowed(n) and registry.get(n).persist_lag() is None
]
assert "pessimistic" in names
for name in names:
    # 0.30 - 0.10 - 0.10 - 0.10 is -2.8e-17 in floating point: the last grab broke the CHECK
    # (surplus_amount >= surplus_count * 0.01) while strategies decremented unrounded.
    exact = services.activity_send(
        sender_id=sender.pk, total_amount=Decimal("0.30"), total_count=3,
        strategy=name, allocation_kind="equal",
    )
    for user in grabbers[:3]:
        answer = services.activity_grab(activity_id=exact.pk, user_id=user.pk)
        assert answer.outcome == "grabbed", name

    contended = services.activity_send(
        sender_id=sender.pk, total_amount=Decimal("10.00"), total_count=10, strategy=name
    )
    barrier = threading.Barrier(80)
    answers = []

    def click(user):
        barrier.wait()
        try:
            answer = services.activity_grab(activity_id=contended.pk, user_id=user.pk)
            answers.append((user.pk, answer))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click, args=(u,)) for u in grabbers for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 80, (name, len(answers))
    grabbed = [(user, r.amount_cents) for user, r in answers if r.outcome == "grabbed"]
    assert len(grabbed) == 10 and len({user for user, _ in grabbed}) == 10, (name, grabbed)
    assert sum(cents for _, cents in grabbed) == 1000, name

    for activity in Activity.objects.filter(pk__in=[exact.pk, contended.pk]):
        told = grabbed if activity.pk == contended.pk else None
        report = audit_activity(activity, answers=told)
        assert report.ok, (name, report.violations)
        assert activity.surplus_count == 0 and activity.surplus_amount == 0, (name, activity)
    print(name, "ok")
# The money adds up too: every grab credited once, the books sum to exactly 0.
ledger.grabs_credit(batch=7, run_seconds=60)
books = audit_books(drained=True)
assert books.ok, books.violations
print("ok")
"""


def test_grabs_stay_exact_on_sqlite(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "redpack.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path}/redpack.sqlite3",
        "REDIS_URL": settings.CACHES["default"]["LOCATION"],  # emptied before every test
        "SECRET_KEY": settings.SECRET_KEY,
        "REDPACK_GRAB_RATE": "",
        "LOG_LEVEL": "WARNING",
    }
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert result.stdout.strip().endswith("ok")
