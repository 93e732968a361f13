"""redis_queue and redis_counter beyond the contract: failures, data loss, audit, amounts, TTL."""

import secrets
import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone
from django_redis import get_redis_connection

from redpack import services
from redpack.audit import audit_activity
from redpack.errors import Forbidden
from redpack.models import Activity, GrabDetail, Packet
from redpack.money import from_cents, to_cents
from strategies import registry
from strategies.base import Outcome, RequestChecks
from strategies.lua import script
from strategies.redis_state.keys import Keys, now_ms, run_grabs
from strategies.request_checks import checks_arg
from tests.contract.harness import grab_concurrently

REDIS_STRATEGIES = ["redis_queue", "redis_counter"]


def send(sender, strategy: str, total: str, count: int, **options):  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal(total),
        total_count=count,
        strategy=strategy,
        expires_in=options.pop("expires_in", 3600),
        **options,
    )


def snapshot(activity_id: int) -> dict[str, object]:
    """The activity's Redis state, minus the epoch token (a rebuild draws a new one)."""
    meta, count, grabbed, packets, _ = script("snapshot")(keys=Keys(activity_id).ordered())
    meta_fields = dict(zip(meta[::2], meta[1::2], strict=True))
    meta_fields.pop(b"epoch")
    return {
        "meta": meta_fields,
        "count": count,
        "grabbed": dict(zip(grabbed[::2], grabbed[1::2], strict=True)),
        "packets": packets,
    }


def audited(activity: Activity, answers: list[tuple[int, int]] | None = None) -> list[str]:
    activity.refresh_from_db()
    return audit_activity(activity, answers=answers).violations


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", REDIS_STRATEGIES)
def test_failed_mysql_write_gives_everything_back_and_the_user_may_retry(
    strategy, make_users, sender
):
    """A grab by a user whose row is not in MySQL yet (the grab API trusts the signed token
    alone) fails on the detail row's foreign key: Redis must be as if it never happened."""
    (someone,) = make_users(1)
    activity = send(sender, strategy, "10.00", 5)
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=someone.pk).outcome
        is Outcome.GRABBED
    )
    before = snapshot(activity.pk)
    newcomer_id = someone.pk + 1000

    with pytest.raises(Forbidden):  # refused (403), not a server error
        services.activity_grab(activity_id=activity.pk, user_id=newcomer_id)

    assert snapshot(activity.pk) == before  # the packet is back in its place, no mark is left
    assert audited(activity) == []
    get_user_model().objects.create(pk=newcomer_id, username="newcomer")
    retry = services.activity_grab(activity_id=activity.pk, user_id=newcomer_id)
    assert retry.outcome is Outcome.GRABBED
    again = services.activity_grab(activity_id=activity.pk, user_id=newcomer_id)
    assert (again.outcome, again.amount_cents) == (Outcome.ALREADY_GRABBED, retry.amount_cents)
    assert audited(activity) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", REDIS_STRATEGIES)
def test_a_requests_checks_in_the_grab_script_take_nothing_and_count_once(
    strategy, make_users, sender
):
    """lua/grab.lua's checks (a web request's ban and throttle): a disabled user and a request
    over its window take nothing; a re-run of a winning attempt (its reply lost) gets its
    grab back and is not counted again; a member without checks is not checked."""
    activity = send(sender, strategy, "3.00", 3)
    keys = Keys(activity.pk).ordered()
    client = get_redis_connection("default")
    allowed, banned, other = make_users(3)
    client.sadd("test:bans", banned.pk)
    window = f"test:window:{secrets.token_hex(4)}"
    checks = checks_arg(RequestChecks("test:bans", window, 1, 60))

    def run(*members: tuple[int, str, str]) -> list[tuple[str, str | None]]:
        replies = run_grabs(keys, list(members), *registry.get(strategy).script_args())
        return [(reply.outcome, reply.mark) for reply in replies]

    before = snapshot(activity.pk)
    assert run((banned.pk, "b1", checks)) == [("disabled", None)]
    assert snapshot(activity.pk) == before and client.get(window) is None
    ((outcome, mark),) = run((allowed.pk, "a1", checks))
    assert outcome == "grabbed" and client.get(window) == b"1"
    assert run((allowed.pk, "a1", checks)) == [("grabbed", mark)]  # the lost reply's re-run
    assert client.get(window) == b"1"
    assert run((allowed.pk, "a2", checks)) == [("throttled", "2")]
    # Without checks (the bench, a ban-free caller), the same window and set are not asked.
    assert run((banned.pk, "b2", ""))[0][0] == "grabbed"
    assert run((other.pk, "o1", checks_arg(RequestChecks("test:bans"))))[0][0] == "grabbed"
    assert client.get(window) == b"2" and 0 < client.ttl(window) <= 60
    client.delete("test:bans", window)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", REDIS_STRATEGIES)
def test_refusals_come_in_the_order_of_the_contract(strategy, make_users, sender):
    """closed, then already_grabbed, then sold_out (strategies.base.refusal), lock-free or not."""
    winner, late, later = make_users(3)
    activity = send(sender, strategy, "1.00", 1)
    won = services.activity_grab(activity_id=activity.pk, user_id=winner.pk)
    assert won.outcome is Outcome.GRABBED

    again = services.activity_grab(activity_id=activity.pk, user_id=winner.pk)
    assert (again.outcome, again.amount_cents) == (Outcome.ALREADY_GRABBED, won.amount_cents)
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=late.pk).outcome is Outcome.SOLD_OUT
    )
    services.activity_expire(activity_id=activity.pk, force=True)  # closes through the strategy
    for user in (winner, late, later):
        assert (
            services.activity_grab(activity_id=activity.pk, user_id=user.pk).outcome
            is Outcome.CLOSED
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", REDIS_STRATEGIES)
def test_flushdb_mid_run_then_redis_rebuild_keeps_every_invariant(strategy, make_users, sender):
    users = make_users(120)
    activity = send(sender, strategy, "100.00", 60)
    flushed = threading.Event()

    def flush_once_grabs_land() -> None:
        try:
            give_up = time.monotonic() + 60
            while time.monotonic() < give_up:
                if GrabDetail.objects.filter(activity=activity).count() >= 10:
                    break
                time.sleep(0.005)
            get_redis_connection("default").flushdb()
            flushed.set()
        finally:
            connection.close()

    flusher = threading.Thread(target=flush_once_grabs_land)
    flusher.start()
    first_wave = grab_concurrently(activity.pk, [u.pk for u in users[:80]], clicks_per_user=2)
    flusher.join()
    assert flushed.is_set()
    assert "Redis holds no state for open activity" in " ".join(audited(activity))

    call_command("redis_rebuild")
    call_command("redis_rebuild", "--activity", activity.pk)  # twice: idempotent
    assert audited(activity) == []
    second_wave = grab_concurrently(activity.pk, [u.pk for u in users], clicks_per_user=1)

    answers = [
        (a.user_id, a.result.amount_cents)
        for a in first_wave + second_wave
        if a.result.outcome is Outcome.GRABBED
    ]
    assert audited(activity, answers) == []
    activity.refresh_from_db()
    if not any(a.result.outcome is Outcome.CONTENDED for a in second_wave):
        assert activity.surplus_count == 0  # 120 users for 60 packets: all were taken
    rows = GrabDetail.objects.filter(activity=activity)
    assert rows.count() + activity.surplus_count == 60


@pytest.mark.django_db(transaction=True)
def test_audit_names_what_differs_between_redis_queue_and_mysql(make_users, sender):
    users = make_users(2)
    activity = send(sender, "redis_queue", "10.00", 4)
    grabbed = services.activity_grab(activity_id=activity.pk, user_id=users[0].pk)
    keys = Keys(activity.pk)
    redis = get_redis_connection("default")
    first_left = redis.lindex(f"{keys.tag}packets", 0).decode()
    cents, packet_id = (int(part) for part in first_left.split(":"))
    redis.lrem(f"{keys.tag}packets", 1, first_left)
    redis.hset(f"{keys.tag}grabbed", users[0].pk, f"{grabbed.amount_cents + 1}:999")
    redis.persist(f"{keys.tag}meta")

    violations = " ".join(audited(activity))
    removed = f"packet {packet_id} ({from_cents(cents)}) available in MySQL but not in Redis list"
    assert removed in violations
    assert f"user {users[0].pk} has {from_cents(grabbed.amount_cents)} (packet" in violations
    assert f"but {from_cents(grabbed.amount_cents + 1)} (packet 999) in Redis" in violations
    assert f"{keys.tag}meta never expires" in violations

    call_command("redis_rebuild", "--activity", activity.pk)
    assert audited(activity) == []


@pytest.mark.django_db(transaction=True)
def test_audit_names_what_differs_between_redis_counter_and_mysql(make_users, sender):
    users = make_users(3)
    activity = send(sender, "redis_counter", "10.00", 4)
    grabbed = services.activity_grab(activity_id=activity.pk, user_id=users[0].pk)
    keys = Keys(activity.pk)
    redis = get_redis_connection("default")
    redis.hset(f"{keys.tag}grabbed", users[0].pk, 999)  # above any first draw of 10.00 / 4
    redis.hset(f"{keys.tag}grabbed", users[1].pk, 150)
    redis.incr(f"{keys.tag}count")

    violations = " ".join(audited(activity))
    shown = from_cents(grabbed.amount_cents)
    assert f"user {users[0].pk} has {shown} in MySQL but 9.99 in Redis" in violations
    assert f"user {users[1].pk} has nothing in MySQL but 1.50 in Redis" in violations
    assert "3 packets left in MySQL but 4 in Redis" in violations

    call_command("redis_rebuild")
    assert audited(activity) == []
    before = snapshot(activity.pk)
    call_command("redis_rebuild", "--activity", activity.pk)
    assert snapshot(activity.pk) == before


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("allocation", "total_cents", "count"),
    [
        ("double_average", 10_000, 30),
        ("double_average", 33, 30),  # three cents to spread beyond the minimum
        ("line_segment", 10_000, 30),
        ("line_segment", 31, 30),
        ("equal", 10_000, 30),
        ("equal", 1_001, 7),
    ],
)
def test_redis_counter_draws_in_lua_like_the_allocation_module(
    allocation, total_cents, count, make_users, sender
):
    """Each amount lies where allocation.draw() would put it; the last takes the rest."""
    users = make_users(count)
    activity = send(
        sender, "redis_counter", str(from_cents(total_cents)), count, allocation_kind=allocation
    )
    remaining = total_cents
    for left, user in zip(range(count, 0, -1), users, strict=True):
        result = services.activity_grab(activity_id=activity.pk, user_id=user.pk)
        assert result.outcome is Outcome.GRABBED
        cents = result.amount_cents
        ceiling = remaining - (left - 1)
        if left == 1:
            assert cents == remaining
        elif allocation == "double_average":
            assert 1 <= cents <= min(2 * remaining // left, ceiling)
        elif allocation == "line_segment":
            assert 1 <= cents <= ceiling
        else:
            assert cents == -(-remaining // left)
        remaining -= cents
    assert remaining == 0
    assert audited(activity) == []


DRAWS = 1000


@pytest.mark.parametrize(
    ("allocation", "remaining", "count", "mean", "deviation"),
    [
        ("double_average", 100, 4, 25.5, 14.43),  # uniform in [1, 50]
        ("line_segment", 100, 4, 25.0, 18.98),  # smallest of 3 cuts among 99 (Floyd's sampling)
        ("line_segment", 100, 31, 100 / 31, 2.61),  # smallest of 30 cuts among 99 (the walk)
    ],
)
def test_redis_counter_first_draw_has_the_allocations_mean(
    allocation, remaining, count, mean, deviation
):
    """Bounds alone would let a skewed draw pass: the mean of many first draws, within 5 SE.

    The means are exact ((n + 1) / (k + 1) for the smallest of k cuts among n), the standard
    deviations those of allocation.draw() measured over 200,000 draws."""
    keys = Keys(990001).ordered()
    draws = []
    for user_id in range(DRAWS):
        far = now_ms() + 60_000
        script("install")(keys=keys, args=["e", "open", far, far, allocation, count, remaining, 0])
        reply = script("grab")(
            keys=keys, args=[now_ms(), "draw", secrets.randbelow(2**31), user_id, "attempt", ""]
        )
        draws.append(int(reply[2]))  # epoch, then (outcome, mark, holder)
    assert min(draws) >= 1 and max(draws) <= remaining - (count - 1)
    assert abs(sum(draws) / DRAWS - mean) < 5 * deviation / DRAWS**0.5


@pytest.mark.django_db(transaction=True)
def test_redis_counter_draws_follow_the_seed_python_passes(make_users, sender):
    """Redis 7 seeds the scripts' generator with a constant at start-up, so every restart would
    replay the same amounts; the script reseeds from the caller's fresh seed instead."""
    users = make_users(6)
    twins = [send(sender, "redis_counter", "100.00", 6) for _ in range(2)]
    keys_of = registry.get("redis_counter").state_keys  # type: ignore[attr-defined]

    def amounts(activity: Activity, first_seed: int) -> list[int]:
        marks = [
            run_grabs(keys_of(activity.pk), [(user.pk, f"t{i}", "")], "draw", first_seed + i)[
                0
            ].mark
            for i, user in enumerate(users)
        ]
        return [int(mark) for mark in marks]

    assert amounts(twins[0], 1000) == amounts(twins[1], 1000)
    call_command("redis_rebuild")  # back to nothing grabbed (MySQL never heard of those)
    assert amounts(twins[0], 1000) != amounts(twins[1], 2000)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", REDIS_STRATEGIES)
def test_state_expires_a_grace_period_after_the_activity(strategy, make_users, sender, settings):
    settings.REDPACK_REDIS_STATE_GRACE = 1
    (user,) = make_users(1)
    activity = send(sender, strategy, "1.00", 2, expires_in=2)
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=user.pk).outcome is Outcome.GRABBED
    )
    redis = get_redis_connection("default")
    for key in Keys(activity.pk).ordered():
        if redis.exists(key):
            assert 0 < redis.pttl(key) <= 3000
    gone_at = activity.expires_at + timedelta(seconds=1.2)
    time.sleep(max(0.0, (gone_at - timezone.now()).total_seconds()))

    assert not redis.exists(*Keys(activity.pk).ordered())
    assert (
        services.activity_grab(activity_id=activity.pk, user_id=user.pk).outcome is Outcome.CLOSED
    )
    assert audited(activity) == []  # nothing in Redis to compare once it expired
    left = registry.get(strategy).close(activity_id=activity.pk)
    activity.refresh_from_db()
    assert (left.remaining_count, left.remaining_cents) == (1, to_cents(activity.surplus_amount))


@pytest.mark.django_db(transaction=True)
def test_redis_queue_keeps_the_split_packets_in_mysql_and_redis(make_users, sender):
    activity = send(sender, "redis_queue", "5.00", 5, allocation_kind="line_segment")
    packets = list(Packet.objects.filter(activity=activity).order_by("pk"))
    assert sum(to_cents(p.amount) for p in packets) == 500
    listed = get_redis_connection("default").lrange(f"{Keys(activity.pk).tag}packets", 0, -1)
    assert listed == [f"{to_cents(p.amount)}:{p.pk}".encode() for p in packets]


@pytest.mark.django_db(transaction=True)
def test_redis_rebuild_refuses_activities_without_redis_state(sender):
    activity = send(sender, "pessimistic", "1.00", 1)
    with pytest.raises(CommandError, match="keeps no Redis state"):
        call_command("redis_rebuild", "--activity", activity.pk)


def test_attempt_tokens_are_unique_across_threads_and_a_forked_child() -> None:
    """A grab's attempt token tells its own re-run from another grab of the same user: two
    calls must never share one, in one process or in a child forked from it."""
    import os

    from strategies.redis_state.keys import new_attempt

    made: list[list[str]] = [[] for _ in range(8)]

    def draw(index: int) -> None:
        made[index].extend(new_attempt() for _ in range(5000))

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tokens = [token for share in made for token in share]
    assert len(set(tokens)) == len(tokens) == 40_000
    assert all("|" not in token and ":" not in token for token in tokens)  # the mark's separators

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.write(write, new_attempt().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    in_child = os.read(read, 100).decode()
    os.close(read)
    mine = new_attempt()
    assert in_child and in_child not in tokens and in_child.split(".")[0] != mine.split(".")[0]
