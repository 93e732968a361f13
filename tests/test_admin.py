import pytest
from django.contrib.auth import get_user_model

from redpack import ledger, services
from redpack.audit import audit_books
from redpack.models import Account, Activity, JournalEntry

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):  # type: ignore[no-untyped-def]
    boss = get_user_model().objects.create_superuser("boss", "boss@example.com", "boss-pass-123")
    ledger.wallets_top_up(user_ids=[boss.pk], memo="test staff")
    client.login(username="boss", password="boss-pass-123")
    return client


def test_admin_creates_an_activity_through_the_service(staff_client):
    response = staff_client.post(
        "/admin/redpack/activity/add/",
        {
            "total_amount": "12.34",
            "total_count": "5",
            "strategy": "pessimistic",
            "allocation": "line_segment",
            "expires_in": "600",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    activity = Activity.objects.get()
    assert activity.surplus_count == 5 and str(activity.surplus_amount) == "12.34"
    assert activity.allocation == "line_segment" and activity.sender.username == "boss"


def test_admin_refuses_an_impossible_activity(staff_client):
    response = staff_client.post(
        "/admin/redpack/activity/add/",
        {
            "total_amount": "0.04",
            "total_count": "5",
            "strategy": "pessimistic",
            "allocation": "equal",
            "expires_in": "600",
        },
    )
    assert response.status_code == 200
    assert "cannot give 5 packets" in response.content.decode()
    assert not Activity.objects.exists()


def test_admin_list_shows_progress_and_filters(staff_client, make_users):
    sender = make_users(1)[0]
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="3.00", total_count=3, strategy="pessimistic"
    )
    services.activity_grab(activity_id=activity.pk, user_id=make_users(1)[0].pk)
    page = staff_client.get("/admin/redpack/activity/?strategy=pessimistic&status=open")
    assert page.status_code == 200
    assert "1 / 3" in page.content.decode()
    detail = staff_client.get(f"/admin/redpack/activity/{activity.pk}/change/")
    assert detail.status_code == 200


def test_admin_is_staff_only(client, make_users):
    user = make_users(1)[0]
    user.set_password("plain-pass-123")
    user.save()
    client.login(username=user.username, password="plain-pass-123")
    assert client.get("/admin/redpack/activity/").status_code == 302


def test_admin_shows_the_latest_report_and_live_progress(staff_client, make_users):
    page = staff_client.get("/admin/redpack/activity/report/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "Latest comparison" in body and "pessimistic" in body  # from reports/compare.json
    # Its HTTP runs as people read them: every request's cause and a latency histogram.
    assert (
        "every request&#x27;s answer and wait" in body or "every request's answer and wait" in body
    )
    assert "grabbed 100, sold_out" in body and "latency-histogram" in body and "within 1 s" in body
    chart = staff_client.get("/admin/redpack/activity/report/chart.png")
    assert chart.status_code == 200 and chart["Content-Type"] == "image/png"
    assert (
        "/admin/redpack/activity/report/"
        in staff_client.get("/admin/redpack/activity/").content.decode()
    )
    sender = make_users(1)[0]
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="3.00", total_count=3, strategy="pessimistic"
    )
    change = staff_client.get(f"/admin/redpack/activity/{activity.pk}/change/").content.decode()
    assert 'http-equiv="refresh"' in change  # an open activity's page follows its progress


def test_admin_report_is_staff_only(client):
    assert client.get("/admin/redpack/activity/report/").status_code == 302


def test_admin_books_are_read_only_and_show_the_crediting_lag(staff_client, make_users):
    sender = make_users(1)[0]
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="3.00", total_count=3, strategy="pessimistic"
    )
    services.activity_grab(activity_id=activity.pk, user_id=make_users(1)[0].pk)
    accounts = staff_client.get("/admin/redpack/account/").content.decode()
    assert "Waiting to be credited: <strong>1</strong> grabs" in accounts
    wallet = Account.objects.get(user=sender)
    page = staff_client.get(f"/admin/redpack/account/{wallet.pk}/change/").content.decode()
    assert "999997.00" in page and 'name="_save"' not in page
    entry = JournalEntry.objects.get(kind="send", activity=activity)
    page = staff_client.get(f"/admin/redpack/journalentry/{entry.pk}/change/").content.decode()
    assert "-3.00" in page and 'name="_save"' not in page
    assert staff_client.get("/admin/redpack/journalentry/add/").status_code == 403
    change = staff_client.get(f"/admin/redpack/activity/{activity.pk}/change/").content.decode()
    assert "escrow" in change and "3.00" in change


def test_admin_deposit_checks_the_amount_and_books_it_from_funding(staff_client, make_users):
    (user,) = make_users(1, balance="0")
    bad = staff_client.post(
        "/admin/redpack/account/deposit/", {"username": user.username, "amount": "0.001"}
    )
    assert bad.status_code == 200 and not Account.objects.filter(user=user).exists()
    ghost = staff_client.post(
        "/admin/redpack/account/deposit/", {"username": "nobody", "amount": "1"}
    )
    assert "no such user" in ghost.content.decode()
    done = staff_client.post(
        "/admin/redpack/account/deposit/",
        {"username": user.username, "amount": "25.50", "memo": "welcome"},
    )
    assert done.status_code == 302
    assert str(Account.objects.get(user=user).balance) == "25.50"
    entry = JournalEntry.objects.get(memo="welcome")
    assert entry.kind == "deposit" and entry.created_by.username == "boss"
    assert audit_books().ok


def test_admin_deposit_needs_its_permission(client, make_users):
    user = make_users(1)[0]
    user.is_staff = True
    user.set_password("plain-pass-123")
    user.save()
    client.login(username=user.username, password="plain-pass-123")
    response = client.post(
        "/admin/redpack/account/deposit/", {"username": user.username, "amount": "1"}
    )
    assert response.status_code == 403
