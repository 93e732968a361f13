import pytest
from django.contrib.auth import get_user_model

from redpack import services
from redpack.models import Activity

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):  # type: ignore[no-untyped-def]
    get_user_model().objects.create_superuser("boss", "boss@example.com", "boss-pass-123")
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
