"""Hundreds of users double-clicking over real HTTP (gunicorn), checked row by row in MySQL."""

import threading
from decimal import Decimal

import pytest
from rest_framework_simplejwt.tokens import AccessToken

from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail
from redpack.money import to_cents
from strategies import registry
from tests.servers import call, gunicorn

USERS = 200
PACKETS = 50


@pytest.mark.django_db(transaction=True)
def test_http_double_clicks_match_mysql_row_by_row(safe_strategy, make_users, sender):
    strategy = safe_strategy
    users = make_users(USERS)
    tokens = {u.pk: str(AccessToken.for_user(u)) for u in users}
    with gunicorn() as base:
        status, created = call(
            "POST",
            f"{base}/api/activities/",
            str(AccessToken.for_user(sender)),
            {
                "total_amount": "50.00",
                "total_count": PACKETS,
                "strategy": strategy,
                "expires_in": 3600,
            },
        )
        assert status == 201, created
        activity_id = created["id"]
        answers: list[tuple[int, int, dict]] = []
        lock = threading.Lock()
        barrier = threading.Barrier(USERS * 2)

        def click(user_id: int) -> None:
            barrier.wait(timeout=60)
            status, body = call(
                "POST", f"{base}/api/activities/{activity_id}/grab/", tokens[user_id]
            )
            with lock:
                answers.append((user_id, status, body))

        threads = [threading.Thread(target=click, args=(u.pk,)) for u in users for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)

        # Everybody clicks again once the burst is over: most answers now come from the fast
        # path (redpack/finished.py, in each of the server's processes), and each must still
        # say what MySQL holds for that user.
        assert registry.get(strategy).settle(activity_id=activity_id, timeout=60)
        # What MySQL holds after the first burst; the second may grab what it left (a grab shed
        # at once, 409 `shed`, left its packet for a later click).
        rows = dict(
            GrabDetail.objects.filter(activity_id=activity_id).values_list("user_id", "amount")
        )
        again: list[tuple[int, int, dict]] = []

        def click_again(user_id: int) -> None:
            status, body = call(
                "POST", f"{base}/api/activities/{activity_id}/grab/", tokens[user_id]
            )
            with lock:
                again.append((user_id, status, body))

        threads = [threading.Thread(target=click_again, args=(u.pk,)) for u in users]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)

    assert len(answers) == USERS * 2 and len(again) == USERS
    assert {status for _, status, _ in answers} <= {200, 409}
    assert registry.get(strategy).settle(activity_id=activity_id, timeout=60)
    grabbed = [
        (u, to_cents(Decimal(b["amount"]))) for u, _, b in answers if b["outcome"] == "grabbed"
    ]
    for user_id, _, body in answers:
        if body["outcome"] in {"grabbed", "already_grabbed"}:
            assert to_cents(rows[user_id]) == to_cents(Decimal(body["amount"]))
    assert {status for _, status, _ in again} <= {200, 409}
    assert registry.get(strategy).settle(activity_id=activity_id, timeout=60)
    grabbed += [
        (u, to_cents(Decimal(b["amount"]))) for u, _, b in again if b["outcome"] == "grabbed"
    ]
    final = dict(
        GrabDetail.objects.filter(activity_id=activity_id).values_list("user_id", "amount")
    )
    activity = Activity.objects.get(pk=activity_id)
    for user_id, _, body in again:
        if body["outcome"] == "already_grabbed":
            assert user_id in rows and to_cents(rows[user_id]) == to_cents(Decimal(body["amount"]))
        elif body["outcome"] == "grabbed":
            assert user_id not in rows
            assert to_cents(final[user_id]) == to_cents(Decimal(body["amount"]))
        elif body["outcome"] == "sold_out":
            assert user_id not in final and activity.surplus_count == 0
        else:  # this attempt got nothing: its user holds what it held before it (or nothing)
            assert body["outcome"] == "contended"
            assert final.get(user_id) == rows.get(user_id)
    report = audit_activity(activity, answers=grabbed)
    assert report.ok, report.violations
    if not any(b["outcome"] == "contended" for _, _, b in answers + again):
        assert len(final) == PACKETS
