"""The small pieces the lab relies on: bench users, `audit --answers`, GET /api/ping/."""

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from redpack import services
from redpack.lab.users import bench_authorization, bench_sender
from strategies.base import Outcome


@pytest.mark.django_db
def test_create_bench_users_writes_tokens_and_reuses_users(tmp_path):
    path = tmp_path / "users.csv"
    out = io.StringIO()
    call_command("create_bench_users", count=3, output=str(path), stdout=out)
    call_command("create_bench_users", count=4, output=str(path), stdout=out)

    rows = list(csv.DictReader(path.open()))
    assert [r["username"] for r in rows] == [f"bench{i:06d}" for i in range(4)]
    assert all(r["authorization"].startswith("Bearer ey") for r in rows)
    assert out.getvalue().splitlines() == [
        "3 users (3 new) written to " + str(path),
        "4 users (1 new) written to " + str(path),
    ]


@pytest.mark.django_db
def test_ping_needs_a_token_and_nothing_else():
    client = APIClient()
    assert client.get("/api/ping/").status_code == 401

    token = bench_authorization(bench_sender(), ttl=timedelta(minutes=5))
    response = client.get("/api/ping/", HTTP_AUTHORIZATION=token)
    assert response.status_code == 200
    assert response.json() == {"pong": True}


@pytest.mark.django_db(transaction=True)
def test_audit_checks_the_answers_it_is_given(make_users, sender, tmp_path):
    users = make_users(3)
    activity = services.activity_send(
        sender_id=sender.pk, total_amount=Decimal("3.00"), total_count=3, strategy="pessimistic"
    )
    results = [services.activity_grab(activity_id=activity.pk, user_id=u.pk) for u in users[:2]]
    assert {r.outcome for r in results} == {Outcome.GRABBED}
    told = [[u.pk, r.amount_cents] for u, r in zip(users, results, strict=False)]
    answers = tmp_path / "answers.json"

    answers.write_text(json.dumps({str(activity.pk): told}))
    out = io.StringIO()
    call_command("audit", activity=[activity.pk], answers=str(answers), json=True, stdout=out)
    assert json.loads(out.getvalue())["ok"] is True

    answers.write_text(json.dumps({str(activity.pk): told[:1]}))  # one grab nobody was told of
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("audit", activity=[activity.pk], answers=str(answers), json=True, stdout=out)
    (report,) = json.loads(out.getvalue())["reports"]
    assert any("nobody was told of" in v for v in report["violations"])
