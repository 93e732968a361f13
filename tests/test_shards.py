"""Activities sharded over two databases beside default (redpack/shards.py), on the real MariaDB
and Redis: sends land half on each shard, every kind of strategy grabs on both at once, expiry
refunds and crediting settle the money on default, and the auditor checks both shards and the
books. The shard databases are tests/settings.py's TEST_SHARDS."""

import json
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from io import StringIO
from unittest import mock

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import DatabaseError, connections
from django.utils import timezone
from django_redis import get_redis_connection

from redpack import credit_pace, expiry, health, ledger, selectors, services, shards, tasks
from redpack.audit import audit_books
from redpack.models import Activity, GrabDetail, JournalEntry
from redpack.money import to_cents
from strategies import registry
from strategies.base import Outcome
from strategies.redis_queue_async import stream
from tests.api.test_views import client_for
from tests.contract.harness import Answer, grab_concurrently
from tests.settings import TEST_SHARDS as SHARDS
from tests.test_credit_pace import FAST, looked_a_second_ago

STRATEGIES = ["pessimistic", "group_commit", "redis_counter", "redis_queue_async"]
PACKETS = 10
GRABBERS = 6  # fewer than the packets: every activity has something left to refund

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", *SHARDS])


@pytest.fixture(autouse=True)
def sharded(settings):  # type: ignore[no-untyped-def]
    settings.REDPACK_SHARDS = SHARDS
    settings.DATABASE_ROUTERS = ["redpack.shards.ShardRouter"]


def rows_in(alias: str, table: str, column: str = "id") -> list[int]:
    """Read straight from one database, past the router."""
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} ORDER BY {column}")
        return [row[0] for row in cursor.fetchall()]


def send(sender, strategy: str) -> Activity:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("10.00"),
        total_count=PACKETS,
        strategy=strategy,
        expires_in=3600,
    )


def grab_at_once(activities: list[Activity], user_ids: list[int]) -> dict[int, list[Answer]]:
    """The users grab every activity (each clicking twice), the activities at the same time."""
    with ThreadPoolExecutor(len(activities)) as pool:
        futures = {a.pk: pool.submit(grab_concurrently, a.pk, user_ids) for a in activities}
    return {pk: future.result() for pk, future in futures.items()}


def test_activities_split_over_the_shards_and_the_auditor_checks_both(sender, make_users):
    grabbers = make_users(GRABBERS)
    user_ids = [u.pk for u in grabbers]
    activities = [send(sender, strategy) for strategy in STRATEGIES for _ in SHARDS]
    client = client_for(sender)
    for _ in SHARDS:  # and through the API
        body = {"total_amount": "10.00", "total_count": PACKETS, "strategy": "pessimistic"}
        response = client.post("/api/activities/", body, format="json")
        assert response.status_code == 201, response.json()
        activities.append(Activity(pk=response.json()["id"], strategy="pessimistic"))

    on_shard = {alias: rows_in(alias, "t_redpack_activity") for alias in SHARDS}
    assert sorted(on_shard[SHARDS[0]] + on_shard[SHARDS[1]]) == sorted(a.pk for a in activities)
    assert len(on_shard[SHARDS[0]]) == len(on_shard[SHARDS[1]]) == len(activities) // 2
    assert rows_in("default", "t_redpack_activity") == []
    for activity in activities:
        assert activity.pk in on_shard[shards.alias_of(activity.pk)]
    # The API reads each from its own shard.
    first = activities[-1]
    assert client.get(f"/api/activities/{first.pk}/").json()["remaining_count"] == PACKETS

    told: dict[int, dict[int, int]] = {a.pk: {} for a in activities}
    for strategy in STRATEGIES:
        pair = [a for a in activities if a.strategy == strategy][:2]
        assert {shards.alias_of(a.pk) for a in pair} == set(SHARDS)
        for pk, answers in grab_at_once(pair, user_ids).items():
            won = [a for a in answers if a.result.outcome is Outcome.GRABBED]
            assert {a.result.outcome for a in answers} <= {
                Outcome.GRABBED,
                Outcome.ALREADY_GRABBED,
                Outcome.CONTENDED,
            }
            assert len({a.user_id for a in won}) == len(won)
            told[pk] = {a.user_id: a.result.amount_cents for a in won}  # type: ignore[misc]
    answer = client_for(grabbers[0]).post(f"/api/activities/{first.pk}/grab/")
    assert answer.status_code == 200 and answer.json()["outcome"] == "grabbed", answer.json()
    told[first.pk] = {grabbers[0].pk: to_cents(answer.json()["amount"])}

    # redis_queue_async answered from Redis: its persister (the beat task) brings them in.
    assert tasks.persist_grabs() == sum(
        len(told[a.pk]) for a in activities if a.strategy == "redis_queue_async"
    )
    for activity in activities:
        assert stream.waiting(activity.pk) == 0
    grab_ids = {alias: rows_in(alias, "t_redpack_detail") for alias in SHARDS}
    assert not set(grab_ids[SHARDS[0]]) & set(grab_ids[SHARDS[1]])  # ids unique over shards
    for activity in activities:
        alias = shards.alias_of(activity.pk)
        with shards.for_activity(activity.pk):
            rows = dict(
                GrabDetail.objects.filter(activity_id=activity.pk).values_list("user_id", "amount")
            )
        assert {user: to_cents(amount) for user, amount in rows.items()} == told[activity.pk]
        assert set(GrabDetail.objects.using(alias).filter(activity_id=activity.pk)) == set(
            GrabDetail.objects.using(alias).filter(pk__in=grab_ids[alias], activity=activity.pk)
        )

    # Expiry: overdue on both shards; the sweep finds them, the refund task refunds each.
    for alias in SHARDS:
        Activity.objects.using(alias).update(expires_at=timezone.now())
    assert tasks.sweep_overdue() == len(activities)
    due = expiry.claim_due(batch=100, lease_seconds=60)
    assert sorted(due) == sorted(a.pk for a in activities)
    for activity_id in due:
        tasks.refund_activity(activity_id)
    refunds = JournalEntry.objects.filter(kind="refund")
    assert refunds.count() == len(activities)  # each left packets, each refunded once

    assert ledger.crediting_lag()["pending"] == sum(len(t) for t in told.values())
    assert tasks.credit_grabs() == sum(len(t) for t in told.values())
    assert ledger.crediting_lag() == {"pending": 0, "oldest_age_seconds": 0.0}
    spent = sum(10_00 for _ in activities) - sum(
        to_cents(line) for line in refunds.values_list("lines__amount", flat=True) if line > 0
    )
    start = to_cents(django_settings.REDPACK_STARTING_BALANCE)
    assert to_cents(selectors.wallet_balance(user_id=sender.pk)) == start - spent
    for user in grabbers:
        got = sum(t.get(user.pk, 0) for t in told.values())
        assert to_cents(selectors.wallet_balance(user_id=user.pk)) == start + got

    assert selectors.persist_failure_counts() == {}  # /metrics asks every shard
    assert health.check_database() == "ok"  # /healthz probes default and both shards

    # Per-user and per-activity lists, through the API, from both shards.
    mine = client_for(grabbers[0]).get("/api/me/grabs/?limit=500").json()["results"]
    assert sorted(g["activity"] for g in mine) == sorted(
        t for t in told if grabbers[0].pk in told[t]
    )
    assert {shards.alias_of(g["activity"]) for g in mine} == set(SHARDS)
    refunded = client_for(sender).get("/api/me/refunds/?limit=500").json()["results"]
    assert sorted(r["activity"] for r in refunded) == sorted(a.pk for a in activities)
    pair = [a for a in activities if a.strategy == "group_commit"]
    for activity in pair:
        listed = client_for(sender).get(f"/api/activities/{activity.pk}/grabs/").json()["results"]
        assert {g["user"]: to_cents(g["amount"]) for g in listed} == told[activity.pk]

    out = StringIO()
    call_command("audit", "--json", "--drained", stdout=out)
    report = json.loads(out.getvalue())
    assert report["ok"], report
    assert report["shards"] == {
        alias: {"activities": len(activities) // 2, "failed": 0} for alias in SHARDS
    }
    assert {r["shard"] for r in report["reports"]} == set(SHARDS)
    assert all(r["uncredited"] == 0 for r in report["reports"])


def test_a_wrong_shard_read_finds_nothing(sender, make_users):
    grabber = make_users(1)[0]
    activity = send(sender, "pessimistic")
    result = services.activity_grab(activity_id=activity.pk, user_id=grabber.pk)
    assert result.outcome is Outcome.GRABBED
    right = shards.alias_of(activity.pk)
    (wrong,) = set(SHARDS) - {right}
    with shards.using(right):
        assert Activity.objects.filter(pk=activity.pk).exists()
        assert GrabDetail.objects.filter(activity_id=activity.pk).count() == 1
    with shards.using(wrong):
        assert not Activity.objects.filter(pk=activity.pk).exists()
        assert not GrabDetail.objects.filter(activity_id=activity.pk).exists()
    with pytest.raises(shards.NoShardChosen):
        Activity.objects.filter(pk=activity.pk).exists()  # no shard chosen: refused, not guessed


def test_a_refund_entry_cut_short_is_posted_by_the_crediting_sweep(sender):
    activity = send(sender, "group_commit")
    failing = mock.patch.object(ledger, "refund_post", side_effect=DatabaseError("cut short"))
    with failing:
        outcome = services.activity_expire(activity_id=activity.pk, force=True)
    assert outcome.refunded_now and outcome.amount_cents == 10_00
    assert not JournalEntry.objects.filter(kind="refund").exists()
    books = audit_books(drained=True)
    assert books.ok  # the books balance; the activity's own audit sees the escrow still full
    out = StringIO()
    with pytest.raises(SystemExit):
        call_command("audit", "--json", stdout=out)
    (violated,) = json.loads(out.getvalue())["reports"]
    assert violated["violations"] == ["escrow holds 10.00, total − credited − refunded is 0.00"]

    tasks.credit_grabs()
    assert JournalEntry.objects.filter(kind="refund").count() == 1
    tasks.credit_grabs()  # twice: still once
    assert JournalEntry.objects.filter(kind="refund").count() == 1
    call_command("audit", stdout=StringIO())  # clean: no SystemExit
    start = to_cents(django_settings.REDPACK_STARTING_BALANCE)
    assert to_cents(selectors.wallet_balance(user_id=sender.pk)) == start


def test_while_crediting_waits_for_a_burst_it_still_posts_a_refund_cut_short(sender, make_users):
    activity = send(sender, "group_commit")
    (grabber,) = make_users(1, balance="0")
    services.activity_grab(activity_id=activity.pk, user_id=grabber.pk)
    failing = mock.patch.object(ledger, "refund_post", side_effect=DatabaseError("cut short"))
    with failing:
        services.activity_expire(activity_id=activity.pk, force=True)
    assert not JournalEntry.objects.filter(kind="refund").exists()

    looked_a_second_ago(FAST)  # grabs come fast: crediting waits (redpack/credit_pace.py)
    assert tasks.credit_grabs() == 0
    assert JournalEntry.objects.filter(kind="refund").count() == 1  # posted all the same
    assert ledger.crediting_lag()["pending"] == 1


def test_a_shards_ids_step_by_the_shard_count_and_the_rate_counts_rows(sender, make_users):
    activity = send(sender, "group_commit")
    first, then = make_users(2, balance="0")
    services.activity_grab(activity_id=activity.pk, user_id=first.pk)  # the ids' end, here
    looked_a_second_ago(0)
    services.activity_grab(activity_id=activity.pk, user_id=then.pk)
    with shards.for_activity(activity.pk):
        ids = list(GrabDetail.objects.filter(activity_id=activity.pk).values_list("pk", flat=True))
    assert max(ids) - min(ids) == len(SHARDS)
    rate = credit_pace.grab_rate(get_redis_connection("default"))
    assert rate is not None and 0 < rate <= 1  # one row in a second and a little


def test_a_funded_escrow_whose_activity_never_appeared_is_reported(sender):
    with (
        mock.patch.object(services, "_activity_write", side_effect=DatabaseError("shard down")),
        pytest.raises(DatabaseError),
    ):
        send(sender, "pessimistic")
    assert all(rows_in(alias, "t_redpack_activity") == [] for alias in SHARDS)
    books = audit_books()
    assert not books.ok
    (orphan,) = rows_in("default", "t_redpack_activity_id")
    assert books.violations == [f"funded escrows whose activity is on no shard: [{orphan}]"]


def test_the_registry_and_strategies_see_each_shard(sender, make_users):
    """A strategy called directly (as the lab does) runs where the caller says."""
    activity = send(sender, "pessimistic")
    strategy = registry.get("pessimistic")
    with shards.for_activity(activity.pk):
        closed = strategy.close(activity_id=activity.pk)
    assert closed.remaining_count == PACKETS
    assert Activity.objects.using(shards.alias_of(activity.pk)).get(pk=activity.pk).status == (
        "closed"
    )
