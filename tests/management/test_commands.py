import csv
import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from redpack import health, services

pytestmark = pytest.mark.django_db


def test_create_bench_users_writes_working_tokens(tmp_path, sender):
    out = tmp_path / "users.csv"
    call_command("create_bench_users", "--count", "25", "--output", str(out))
    call_command("create_bench_users", "--count", "30", "--output", str(out))  # reuses 25
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


def test_health_fails_a_probe_until_a_worker_ran_the_heartbeat():
    out = io.StringIO()
    call_command("health", stdout=out)  # the database and Redis answer: not down
    assert "database=ok redis=ok" in out.getvalue()
    with pytest.raises(CommandError, match="not ok: worker"):
        call_command("health", "--require", "worker", stdout=io.StringIO())
    health.record_heartbeat()
    call_command("health", "--require", "worker", stdout=io.StringIO())
