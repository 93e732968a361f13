"""unsafe: refused unless allowed, and when allowed the auditor catches what it does."""

from decimal import Decimal

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from redpack import services
from redpack.audit import audit_activity
from redpack.errors import InvalidInput
from redpack.models import Activity
from strategies.base import Outcome
from tests.contract.harness import grab_concurrently

BURSTS = 5  # the race is likely in one burst; repeat, bounded, until it shows


def send_unsafe(sender_id: int, count: int = 20) -> Activity:
    return services.activity_send(
        sender_id=sender_id,
        total_amount=Decimal(count),
        total_count=count,
        strategy="unsafe",
        expires_in=3600,
    )


@pytest.mark.django_db(transaction=True)
def test_the_auditor_reports_the_lost_updates_of_the_unsafe_strategy(make_users, sender):
    users = [u.pk for u in make_users(100)]
    with override_settings(REDPACK_ALLOW_UNSAFE_STRATEGIES=True):
        for _ in range(BURSTS):
            activity = send_unsafe(sender.pk)
            answers = grab_concurrently(activity.pk, users, clicks_per_user=1)
            grabbed = [
                (a.user_id, a.result.amount_cents)
                for a in answers
                if a.result.outcome is Outcome.GRABBED
            ]
            activity.refresh_from_db()
            report = audit_activity(activity, answers=grabbed)
            if not report.ok:
                break

    assert not report.ok
    assert report.oversold > 0
    assert any(v.startswith("count:") for v in report.violations)
    assert report.duplicates == 0  # UNIQUE (activity, user) still holds


@pytest.mark.django_db(transaction=True)
def test_unsafe_is_refused_unless_allowed(sender):
    with pytest.raises(InvalidInput) as refused:
        send_unsafe(sender.pk)
    assert refused.value.field == "strategy"

    client = APIClient()
    client.force_authenticate(user=sender)
    body = {"total_amount": "10.00", "total_count": 5, "strategy": "unsafe"}
    response = client.post("/api/activities/", body, format="json")
    assert response.status_code == 400
    assert "strategy" in response.json()["error"]["fields"]
    listed = {s["name"]: s for s in client.get("/api/strategies/").json()}
    assert listed["unsafe"]["safe"] is False and listed["unsafe"]["allowed"] is False
    assert all(s["safe"] and s["allowed"] for n, s in listed.items() if n != "unsafe")

    with override_settings(REDPACK_ALLOW_UNSAFE_STRATEGIES=True):
        assert client.post("/api/activities/", body, format="json").status_code == 201
        listed = {s["name"]: s for s in client.get("/api/strategies/").json()}
        assert listed["unsafe"]["allowed"] is True
