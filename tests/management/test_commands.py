import csv
import io
import json
from decimal import Decimal

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from redpack import health, selectors, services

pytestmark = pytest.mark.django_db


def test_create_bench_users_writes_working_tokens(tmp_path, sender):
    out = tmp_path / "users.csv"
    call_command("create_bench_users", "--count", "25", "--output", str(out))
    call_command("create_bench_users", "--count", "30", "--output", str(out))  # reuses 25
    assert b"\r" not in out.read_bytes()  # a row cut with `cut -d, -f2` is a header for curl
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 30
    assert get_user_model().objects.filter(username__startswith="bench").count() == 30
    assert all(row["authorization"].startswith("Bearer ") for row in rows)

    activity = services.activity_send(
        sender_id=sender.pk, total_amount="1.00", total_count=2, strategy="pessimistic"
    )
    outcomes = []
    for row in rows[:3]:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=row["authorization"])
        outcomes.append(client.post(f"/api/activities/{activity.pk}/grab/").json()["outcome"])
    assert outcomes == ["grabbed", "grabbed", "sold_out"]


def test_create_demo_admin_never_resets_an_existing_user():
    call_command("create_demo_admin", "--username", "demo", "--password", "demo-pass-1")
    call_command("create_demo_admin", "--username", "demo", "--password", "demo-pass-2")
    user = get_user_model().objects.get(username="demo")
    assert user.is_staff and user.is_superuser and user.check_password("demo-pass-1")


def test_deposit_and_the_audit_of_the_books(make_users, capsys):
    alice, bob = make_users(2, balance="0")
    call_command("deposit", "--amount", "12.50", alice.username, bob.username)
    call_command("deposit", "--amount", "20.00", "--top-up", alice.username, bob.username)
    assert [str(selectors.wallet_balance(user_id=u.pk)) for u in (alice, bob)] == ["20.00"] * 2
    with pytest.raises(CommandError, match="no such user"):
        call_command("deposit", "--amount", "1.00", "nobody")
    with pytest.raises(CommandError, match="amount"):
        call_command("deposit", "--amount", "-1", alice.username)
    capsys.readouterr()
    call_command("audit", "--json", "--drained")
    books = json.loads(capsys.readouterr().out)["books"]
    assert books["ok"] and books["entries"] == 3 and books["uncredited"] == 0  # 2 + 1 top-up
    assert "wallets + escrows + funding = 0" in books["checks"]


def test_demo_and_bench_users_start_with_money(tmp_path):
    call_command("create_demo_admin", "--username", "demo", "--password", "demo-pass-1")
    call_command("create_bench_users", "--count", "3", "--output", str(tmp_path / "u.csv"))
    users = get_user_model().objects.filter(username__in=["demo", "bench000002"])
    balances = {selectors.wallet_balance(user_id=u.pk) for u in users}
    assert balances == {Decimal(settings.REDPACK_STARTING_BALANCE)}


def test_health_fails_a_probe_until_a_worker_ran_the_heartbeat():
    out = io.StringIO()
    call_command("health", stdout=out)  # the database and Redis answer: not down
    assert "database=ok redis=ok" in out.getvalue()
    with pytest.raises(CommandError, match="not ok: worker"):
        call_command("health", "--require", "worker", stdout=io.StringIO())
    health.record_heartbeat()
    call_command("health", "--require", "worker", stdout=io.StringIO())
