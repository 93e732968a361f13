"""unsafe: refused unless allowed, and when allowed the auditor catches what it does."""

import threading
from decimal import Decimal

import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from redpack import services
from redpack.audit import audit_activity
from redpack.errors import InvalidInput
from redpack.models import Activity
from strategies import unsafe
from strategies.base import GrabResult, Outcome


def send_unsafe(sender_id: int, count: int = 20) -> Activity:
    return services.activity_send(
        sender_id=sender_id,
        total_amount=Decimal(count),
        total_count=count,
        strategy="unsafe",
        expires_in=3600,
    )


@pytest.mark.django_db(transaction=True)
def test_the_auditor_reports_the_lost_updates_of_the_unsafe_strategy(
    make_users, sender, monkeypatch
):
    """Two grabs that both read the surplus before either writes it back (held at a barrier
    after their read, so the race happens every run): one decrement is lost."""
    users = [u.pk for u in make_users(2)]
    both_read = threading.Barrier(len(users), timeout=30)
    checked = unsafe.refusal  # called right after the strategy's read of the activity

    def after_the_read(*args, **kwargs):  # type: ignore[no-untyped-def]
        both_read.wait()
        return checked(*args, **kwargs)

    monkeypatch.setattr(unsafe, "refusal", after_the_read)
    results: dict[int, GrabResult] = {}

    def grab(user_id: int) -> None:
        try:
            results[user_id] = services.activity_grab(activity_id=activity.pk, user_id=user_id)
        finally:
            connection.close()

    with override_settings(REDPACK_ALLOW_UNSAFE_STRATEGIES=True):
        activity = send_unsafe(sender.pk)
        threads = [threading.Thread(target=grab, args=(user_id,)) for user_id in users]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert [results[u].outcome for u in users] == [Outcome.GRABBED, Outcome.GRABBED]
    activity.refresh_from_db()
    assert activity.surplus_count == 19  # two grabs, one decrement
    grabbed = [(u, results[u].amount_cents) for u in users]
    report = audit_activity(activity, answers=grabbed)
    assert not report.ok
    assert report.oversold == 1
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
