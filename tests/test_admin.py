import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone

from redpack import admin as admin_module
from redpack import ledger, services
from redpack.audit import audit_books
from redpack.lab import report
from redpack.models import Account, Activity, JournalEntry, Refund

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


def test_admin_report_says_no_run_here_and_shows_the_committed_one_as_another_machines(
    staff_client, tmp_path, monkeypatch
):
    # The committed report, as another machine wrote it: not passed off as this one's.
    committed = json.loads((admin_module.REPORTS / "compare.json").read_text())
    committed["context"]["machine"] = {"id": "another-machine", "host": "elsewhere"}
    (tmp_path / "compare.json").write_text(json.dumps(committed))
    (tmp_path / "compare.png").write_bytes((admin_module.REPORTS / "compare.png").read_bytes())
    monkeypatch.setattr(admin_module, "REPORTS", tmp_path)
    page = staff_client.get("/admin/redpack/activity/report/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "No comparison has run on this machine" in body and "make compare" in body
    assert "measured on another machine" in body and committed["context"]["commit"] in body
    assert 'id="recommendations"' in body and "→ <strong>" in body
    assert "%</td>" in body  # shares as percentages, not fractions
    # Its HTTP runs as people read them: every request's cause and a latency histogram.
    assert (
        "every request&#x27;s answer and wait" in body or "every request's answer and wait" in body
    )
    assert "grabbed 100, sold_out" in body and "latency-histogram" in body and "within 1 s" in body
    # Each hot burst's p99 against its budgets: the ping burst's and the kept-alive ping's.
    assert "hot p99 budget ms" in body and "(ping burst)" in body and "(kept-alive ping)" in body
    chart = staff_client.get("/admin/redpack/activity/report/chart.png")
    assert chart.status_code == 200 and chart["Content-Type"] == "image/png"
    assert (
        "/admin/redpack/activity/report/"
        in staff_client.get("/admin/redpack/activity/").content.decode()
    )


def result_row(strategy: str, run: str, **figures: object) -> dict:
    return {"strategy": strategy, "run": run, "safe": True, "audit_ok": True, **figures}


def this_machines_report(  # type: ignore[no-untyped-def]
    staff_client,
    tmp_path,
    monkeypatch,
    results: list[dict],
    ceilings: list[dict] | None = None,
    **context: object,
) -> str:
    """The admin's report page over `results`, as this machine's latest comparison."""
    context = {"finished_at": "2026-11-20 10:00 UTC", "machine": report.this_machine(), **context}
    (tmp_path / "compare.json").write_text(
        json.dumps({"context": context, "ceilings": ceilings or [], "results": results})
    )
    monkeypatch.setattr(admin_module, "REPORTS", tmp_path)
    return staff_client.get("/admin/redpack/activity/report/").content.decode()


def test_admin_report_of_this_machine_recommends_from_its_figures(
    staff_client, tmp_path, monkeypatch
):
    results = [
        result_row("redis_counter", "bench hot", requests_per_s=900.0, contended_share=0.0),
        result_row("group_commit", "bench hot", requests_per_s=300.0, contended_share=0.25),
        result_row("unsafe", "bench hot", requests_per_s=5000.0, safe=False),
        result_row("redis_queue", "bench throughput", grabs_per_s=800.0),
        result_row("redis_counter", "bench throughput", grabs_per_s=700.0, audit_ok=False),
        result_row("optimistic", "bench throughput", grabs_per_s=50.0),
        result_row("group_commit", "bench throughput", grabs_per_s=400.0),
    ]
    body = this_machines_report(staff_client, tmp_path, monkeypatch, results, commit="abc1234")
    assert "This machine's latest" in body and "abc1234" in body
    assert "2026-11-20 10:00 UTC" in body and report.this_machine()["host"] in body
    assert "No comparison has run" not in body
    recommended = re.findall(r"<td>([^<]+)</td>\s*<td>→ <strong>(\w+)</strong>", body)
    assert recommended == [
        ("Few packets, many users", "redis_counter"),  # unsafe is faster, and never recommended
        ("Many packets", "redis_queue"),  # redis_counter's audit failed in this run
        ("MySQL only (no Redis)", "group_commit"),
    ]
    assert "25.0%" in body  # group_commit's contended share


def test_admin_report_lists_every_round_of_a_repeated_run(staff_client, tmp_path, monkeypatch):
    rounds = [
        {"figure": 0.72, "audit_ok": True, "unanswered": 0},
        {"figure": 0.80, "audit_ok": False, "unanswered": 0},
    ]
    results = [
        result_row("group_commit", "HTTP throughput (wrk)", requests=1_000, rounds=rounds),
        result_row("redis_counter", "HTTP throughput (wrk)", requests=1_000),
    ]
    body = this_machines_report(staff_client, tmp_path, monkeypatch, results)
    assert "rounds (the median kept)" in body
    assert "<strong>0.72; 0.80 audit FAILED</strong>" in body
    assert "pings beside it without a 200" not in body  # every ping answered: no column


def test_admin_report_shows_a_ping_beside_a_run_that_was_not_answered(
    staff_client, tmp_path, monkeypatch
):
    lost = ["round 2: the ping burst before it: 37 without a 200"]
    results = [
        result_row("redis_queue", "HTTP hot (wrk)", requests=10_000, pings_failed=lost),
        result_row("redis_counter", "HTTP hot (wrk)", requests=10_000),
    ]
    body = this_machines_report(staff_client, tmp_path, monkeypatch, results)
    assert "pings beside it without a 200" in body
    assert "<strong>round 2: the ping burst before it: 37 without a 200</strong>" in body


def test_admin_report_shows_a_ceiling_ping_that_was_not_answered(
    staff_client, tmp_path, monkeypatch
):
    ceilings = [
        {
            "name": "Web: GET /api/ping/ burst",
            "kind": "web_burst",
            "tool": "wrk",
            "requests_per_s": 480.0,
            "failed": 37,
        },
        {
            "name": "Web: GET /api/ping/, wrk",
            "kind": "web_wrk",
            "tool": "wrk",
            "requests_per_s": 650.0,
        },
    ]
    results = [result_row("redis_queue", "HTTP hot (wrk)", requests=10_000)]
    body = this_machines_report(staff_client, tmp_path, monkeypatch, results, ceilings)
    assert body.count("without a 200") == 1
    assert "480 <strong>(37 without a 200)</strong>" in body


@pytest.fixture
def activity_of(make_users, staff_client):  # type: ignore[no-untyped-def]
    def send(count: int, **kwargs: object) -> Activity:
        sender = make_users(1, prefix="sender")[0]
        return services.activity_send(
            sender_id=sender.pk,
            total_amount=f"{count}.00",
            total_count=count,
            strategy="pessimistic",
            **kwargs,
        )

    return send


def live(staff_client, activity: Activity, page: int = 1) -> str:  # type: ignore[no-untyped-def]
    url = f"/admin/redpack/activity/{activity.pk}/live/?page={page}"
    return staff_client.get(url).content.decode()


def test_admin_activity_page_is_read_only_and_refreshes_in_place(
    staff_client, activity_of, make_users
):
    activity = activity_of(40)
    grabbers = make_users(30, prefix="grabber")
    for user in grabbers:
        services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    change = staff_client.get(f"/admin/redpack/activity/{activity.pk}/change/").content.decode()
    assert 'http-equiv="refresh"' not in change  # no reload of the whole page
    assert 'name="_save"' not in change and 'name="_continue"' not in change
    assert 'id="live"' in change and "/live/" in change and 'data-live="yes"' in change
    first = live(staff_client, activity)
    assert "30 / 40" in first and "open" in first and "Grabs per second" in first
    assert "Grabs, newest first (30)" in first and "page 1 of 2" in first
    names = re.findall(r"<tr><td>(grabber\d+)</td>", first)
    assert names == [u.username for u in reversed(grabbers[-25:])]  # the newest first
    second = re.findall(r"<tr><td>(grabber\d+)</td>", live(staff_client, activity, page=2))
    assert second == [u.username for u in reversed(grabbers[:5])]


def test_admin_states_sold_out_expired_and_refunded(staff_client, activity_of, make_users):
    sold_out = activity_of(2)
    for user in make_users(2, prefix="grabber"):
        services.activity_grab(activity_id=sold_out.pk, user_id=user.pk)
    expiring = activity_of(3)
    Activity.objects.filter(pk=expiring.pk).update(expires_at=timezone.now())
    listing = staff_client.get("/admin/redpack/activity/").content.decode()
    assert re.search(rf"field-id[^>]*>[^<]*<a[^>]*>{sold_out.pk}</a>.*?sold out", listing, re.S)
    assert 'field-state">expired<' in listing
    assert "2 / 2" in live(staff_client, sold_out) and "sold out" in live(staff_client, sold_out)
    services.activity_expire(activity_id=expiring.pk)
    page = live(staff_client, expiring)
    assert "refunded" in page and "3.00 (3 packets) to the sender at" in page
    assert 'data-live="no"' in page


def test_admin_expire_now_asks_first(staff_client, activity_of):
    activity = activity_of(4)
    url = f"/admin/redpack/activity/{activity.pk}/expire/"
    asked = staff_client.get(url).content.decode()
    assert "Yes, expire now and refund" in asked and "4 packets (4.00) would go back" in asked
    activity.refresh_from_db()
    assert activity.status == "open"
    assert staff_client.post(url).status_code == 302
    assert Refund.objects.get(activity=activity).count == 4
    # The list's action asks too, then expires on the confirmed post.
    other = activity_of(2)
    form = {"action": "expire_now", "_selected_action": [other.pk]}
    asked = staff_client.post("/admin/redpack/activity/", form).content.decode()
    assert "Yes, expire now and refund" in asked and not Refund.objects.filter(activity=other)
    staff_client.post("/admin/redpack/activity/", {**form, "confirmed": "yes"})
    assert Refund.objects.get(activity=other).count == 2


def test_admin_shows_the_embedded_ribbon_only_when_embedded(staff_client):
    assert 'id="embedded-ribbon"' not in staff_client.get("/admin/").content.decode()
    with override_settings(REDPACK_EMBEDDED="embedded SQLite (.run/redpack.sqlite3)"):
        page = staff_client.get("/admin/").content.decode()
    assert 'id="embedded-ribbon"' in page and "Embedded mode: embedded SQLite" in page


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
    for amount in ("0.001", "1e3", "1E+2", "\uff11", "-1", "0", "99999999999"):
        bad = staff_client.post(
            "/admin/redpack/account/deposit/", {"username": user.username, "amount": amount}
        )
        assert bad.status_code == 200 and not Account.objects.filter(user=user).exists(), amount
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
