"""Ceilings belong to the lab: the Redis strategies' own scripts are named here, and each one
takes the KEYS its strategy gives it."""

from decimal import Decimal

import pytest
from django.db import connection

from redpack import services
from redpack.lab.ceilings import (
    STRATEGIES_LUA,
    STRATEGY_SCRIPTS,
    _wrk_ms,
    batch_strategies,
    mysql_raw_batch,
    mysql_raw_seed,
    raw_strategies,
    wrk_failures,
)
from redpack.models import Activity, GrabDetail, Packet, PacketStatus
from redpack.money import to_cents
from strategies import registry
from strategies.redis_state import RedisStateStrategy
from strategies.redis_state.rows import PacketTaken


def test_every_redis_strategy_has_its_script_and_only_they_do():
    redis_strategies = {
        name for name in registry.names() if isinstance(registry.get(name), RedisStateStrategy)
    }
    assert set(STRATEGY_SCRIPTS) == redis_strategies


def test_each_script_exists_and_gets_its_strategys_keys():
    for name, (script, key_count, *rest) in STRATEGY_SCRIPTS.items():
        assert (STRATEGIES_LUA / script).exists()
        keys = rest[: int(key_count)]
        expected = registry.get(name).state_keys(12345)  # type: ignore[attr-defined]
        assert [k.replace("$activity", "12345") for k in keys] == expected


def test_the_seeds_with_statements_of_their_own_have_a_raw_ceiling():
    assert raw_strategies(registry.names()) == [
        name
        for name in registry.names()
        if name in {"distributed_lock", "preallocated", "preallocated_skip_locked"}
        or name == "redis_queue_single"
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", raw_strategies(registry.names()))
def test_a_seeds_raw_statements_grab_every_packet_once_and_leave_nothing(name):
    ceiling = mysql_raw_seed(name, grabs=48, concurrency=4)

    assert ceiling.requests_per_s and ceiling.requests_per_s > 0, ceiling.note
    assert ceiling.strategy == name and ceiling.kind == "mysql_raw_seed"
    assert "48 grabs" in ceiling.note
    # Every grab is a real one (a thread that failed would raise, not be counted), and the
    # ceiling's activity, packets and rows are removed afterwards.
    assert not Activity.objects.exists()
    assert not Packet.objects.exists() and not GrabDetail.objects.exists()


def test_the_batched_strategies_that_write_inside_the_request_have_a_raw_batch_ceiling():
    assert set(batch_strategies(registry.names())) == {"redis_queue", "redis_counter"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["redis_queue", "redis_counter"])
def test_a_raw_batch_ceiling_writes_every_grab_and_leaves_nothing(name):
    ceiling = mysql_raw_batch(name, per_transaction=8, grabs=64, concurrency=4)

    assert ceiling.requests_per_s and ceiling.requests_per_s > 0, ceiling.note
    assert ceiling.strategy == name and ceiling.kind == "mysql_raw_batch_own"
    assert "64 grabs" in ceiling.note  # 4 connections × 2 transactions × 8, none raised
    assert not Activity.objects.exists()
    assert not Packet.objects.exists() and not GrabDetail.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_raw_batch_writes_what_group_commit_writes_or_nothing(sender, make_users):
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("4.00"),
        total_count=4,
        strategy="redis_queue",
        allocation_kind="equal",  # 1.00 each: the failing batch fits the surplus, its claim not
        expires_in=3600,
    )
    first, second, third, fourth = make_users(4)
    packets = list(Packet.objects.filter(activity=activity).order_by("pk"))
    cents = [to_cents(p.amount) for p in packets]
    raw_batch = registry.get("redis_queue").raw_batch
    assert raw_batch is not None

    with connection.cursor() as cursor:
        raw_batch(
            cursor,
            activity_id=activity.pk,
            grabs=[(first.pk, cents[0], packets[0].pk), (second.pk, cents[1], packets[1].pk)],
        )
        with pytest.raises(PacketTaken):  # the first packet is taken: the batch rolls back
            raw_batch(
                cursor,
                activity_id=activity.pk,
                grabs=[(third.pk, cents[2], packets[2].pk), (fourth.pk, cents[0], packets[0].pk)],
            )

    written = GrabDetail.objects.filter(activity=activity)
    assert set(written.values_list("user_id", "redpack_id")) == {
        (first.pk, packets[0].pk),
        (second.pk, packets[1].pk),
    }
    taken = Packet.objects.filter(activity=activity, status=PacketStatus.TAKEN)
    assert set(taken.values_list("pk", "grabbed_by_id")) == {
        (packets[0].pk, first.pk),
        (packets[1].pk, second.pk),
    }
    activity.refresh_from_db()
    assert activity.surplus_count == 2
    assert activity.surplus_amount == packets[2].amount + packets[3].amount


WRK_OUTPUT = """Running 10s test @ http://127.0.0.1:8765/api/ping/
  2 threads and 64 connections
  Latency Distribution
     50%   28.50ms
     75%   35.00ms
     90%    1.20s
     99%  850.00us
  21000 requests in 10.00s, 3.00MB read
Requests/sec:   2100.50
"""


def test_wrk_latencies_are_read_in_milliseconds_whatever_the_unit():
    assert _wrk_ms(WRK_OUTPUT, "50%") == 28.5
    assert _wrk_ms(WRK_OUTPUT, "90%") == 1200.0
    assert _wrk_ms(WRK_OUTPUT, "99%") == 0.85
    assert _wrk_ms(WRK_OUTPUT, "99.9%") is None


WRK_BROKEN = """\
  21000 requests in 10.00s, 3.00MB read
  Socket errors: connect 0, read 12, write 3, timeout 40
  Non-2xx or 3xx responses: 7
Requests/sec:   2100.50
"""


def test_a_kept_alive_ping_counts_wrk_s_broken_connections_and_non_2xx_answers_not_its_timeouts():
    assert wrk_failures(WRK_BROKEN) == (7, 15)
    assert wrk_failures(WRK_OUTPUT) == (0, 0)
