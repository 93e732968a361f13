"""The auditor and its command catch corruption; system checks catch a bad strategy setting."""

import json
import threading
from decimal import Decimal

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import connection

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail
from strategies.base import Outcome

pytestmark = pytest.mark.django_db


@pytest.fixture
def grabbed_activity(sender, make_users):  # type: ignore[no-untyped-def]
    activity = services.activity_send(
        sender_id=sender.pk, total_amount=Decimal("5.00"), total_count=5, strategy="pessimistic"
    )
    for user in make_users(3):
        services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    activity.refresh_from_db()
    return activity


def test_clean_activity_passes(grabbed_activity, capsys):
    report = audit_activity(grabbed_activity)
    assert report.ok and report.grabbed == 3 and report.oversold == 0
    call_command("audit", "--activity", str(grabbed_activity.pk))
    assert "0 with violations" in capsys.readouterr().out


def test_lost_update_is_reported_as_oversold(grabbed_activity, capsys):
    Activity.objects.filter(pk=grabbed_activity.pk).update(
        surplus_count=3, surplus_amount=grabbed_activity.surplus_amount
    )
    grabbed_activity.refresh_from_db()
    report = audit_activity(grabbed_activity)
    assert not report.ok and report.oversold == 1
    with pytest.raises(SystemExit) as exit_info:
        call_command("audit", "--json")
    assert exit_info.value.code == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["reports"][0]["oversold"] == 1


def test_invented_money_is_reported(grabbed_activity):
    detail = GrabDetail.objects.filter(activity=grabbed_activity).first()
    GrabDetail.objects.filter(pk=detail.pk).update(amount=detail.amount + Decimal("0.50"))
    report = audit_activity(grabbed_activity)
    assert any(v.startswith("amount:") for v in report.violations)


def test_answers_must_match_rows(grabbed_activity):
    rows = list(
        GrabDetail.objects.filter(activity=grabbed_activity).values_list("user_id", "amount")
    )
    told = [(user_id, int(amount * 100)) for user_id, amount in rows]
    assert audit_activity(grabbed_activity, answers=told).ok
    wrong_amount = [(told[0][0], told[0][1] + 1), *told[1:]]
    assert not audit_activity(grabbed_activity, answers=wrong_amount).ok
    unannounced = told[1:]
    assert not audit_activity(grabbed_activity, answers=unannounced).ok
    told_twice = [*told, told[0]]
    report = audit_activity(grabbed_activity, answers=told_twice)
    assert not report.ok and report.duplicates == 1


def test_audit_of_unknown_activity_fails():
    with pytest.raises(Exception, match="does not exist"):
        call_command("audit", "--activity", "424242")


def test_unknown_or_broken_strategy_fails_the_system_check(settings):
    settings.REDPACK_STRATEGIES = {
        "pessimistic": "strategies.pessimistic.PessimisticStrategy",
        "ghost": "strategies.ghost.GhostStrategy",
        "renamed": "strategies.pessimistic.PessimisticStrategy",
        "not_a_strategy": "redpack.money.to_cents",
    }
    errors = checks.run_checks()
    ids = {error.id for error in errors}
    assert {"redpack.E001", "redpack.E002", "redpack.E003"} <= ids


def test_configured_strategies_pass_the_system_check():
    assert not [e for e in checks.run_checks() if e.id and e.id.startswith("redpack.")]


def test_a_celery_broker_in_the_packet_states_database_fails_the_system_check(settings):
    from redpack.checks import check_celery_broker_apart

    assert check_celery_broker_apart() == []
    settings.CELERY_BROKER_URL = settings.CACHES["default"]["LOCATION"]
    assert [e.id for e in check_celery_broker_apart()] == ["redpack.E010"]


@pytest.mark.django_db(transaction=True)
def test_a_grab_committed_while_auditing_is_not_an_oversold_packet(sender, make_users):
    """The auditor reads the activity and its grabs statement by statement; a grab that commits
    between those reads (from another connection) must not make a live activity look oversold:
    every read sees the snapshot of the first."""
    activity = services.activity_send(
        sender_id=sender.pk, total_amount=Decimal("5.00"), total_count=5, strategy="pessimistic"
    )
    first, second = make_users(2)
    services.activity_grab(activity_id=activity.pk, user_id=first.pk)
    stale = Activity.objects.get(pk=activity.pk)  # what a caller read before the audit
    committed: list[object] = []

    def grab_before_the_first_count(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if not committed and "COUNT(" in sql:
            worker = threading.Thread(
                target=lambda: committed.append(
                    services.activity_grab(activity_id=activity.pk, user_id=second.pk).outcome
                )
            )
            worker.start()
            worker.join()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(grab_before_the_first_count):
        report = audit_activity(stale)
    assert committed == [Outcome.GRABBED]
    assert report.ok, report.violations
    assert (report.grabbed, report.oversold) == (1, 0)  # the snapshot before the second grab
    assert audit_activity(stale).grabbed == 2
