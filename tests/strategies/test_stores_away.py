"""A grab whose MySQL or Redis cannot be reached: 503 `outcome_unknown` (services:
OutcomeUnknown), never a server error, and the same user's retry converges on the one true
answer. A one-grab transaction whose COMMIT lost its reply is settled from its own rows. Faults
through tests/faults.py in front of the real MariaDB and Redis."""

import hashlib
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import MySQLdb
import pytest
from django.db import IntegrityError, InterfaceError, OperationalError, connection
from django.test import Client
from redis import Redis
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.lock import Lock
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import AccessToken

from redpack import health, selectors, services
from redpack.audit import audit_activity
from redpack.errors import OutcomeUnknown
from redpack.models import Activity, GrabDetail
from redpack.money import to_cents
from strategies import registry, steps
from strategies.base import GrabResult, Outcome
from strategies.lua import WRITE_PROBE_KEY
from tests.faults import FaultProxy
from tests.servers import free_port, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# The strategies that grab in one transaction of their own per grab, on MySQL alone or under a
# Redis lock; their transaction ends with a COMMIT sent on its own.
ONE_GRAB = ["pessimistic", "optimistic", "preallocated", "preallocated_skip_locked"]
ONE_GRAB += ["distributed_lock"]
BARE_COMMIT = b"\x03COMMIT"  # a COM_QUERY of COMMIT alone (not `READ COMMITTED`, not `; COMMIT`)


def send(sender, strategy: str, **options) -> Activity:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("3.00"),
        total_count=3,
        strategy=strategy,
        **options,
    )


def grab(activity: Activity, user) -> GrabResult:  # type: ignore[no-untyped-def]
    return services.activity_grab(activity_id=activity.pk, user_id=user.pk)


def row_of(activity: Activity, user) -> int | None:  # type: ignore[no-untyped-def]
    amount = (
        GrabDetail.objects.filter(activity=activity, user=user)
        .values_list("amount", flat=True)
        .first()
    )
    return None if amount is None else to_cents(amount)


def assert_consistent(activity: Activity) -> None:
    assert registry.get(activity.strategy).settle(activity_id=activity.pk, timeout=10)
    activity.refresh_from_db()
    report = audit_activity(activity)
    assert report.ok, report.violations


@pytest.mark.parametrize("strategy", ONE_GRAB)
def test_a_grab_whose_commit_reply_is_lost_is_answered_from_its_row(
    strategy, mysql_proxy, make_users, sender
):
    """MySQL committed, the reply never came: MySQL, asked behind the row lock, holds the
    grab's row with its INSERT's created_at (steps.GrabTransaction.commit), so the grab is
    answered as if the reply had come."""
    activity = send(sender, strategy)
    (user,) = make_users(1)
    connection.ensure_connection()
    mysql_proxy.drop_reply(BARE_COMMIT)
    answer = grab(activity, user)
    assert mysql_proxy.fired == 1
    held = row_of(activity, user)
    assert held is not None
    assert answer == GrabResult(Outcome.GRABBED, held)
    assert grab(activity, user) == GrabResult(Outcome.ALREADY_GRABBED, held)
    assert_consistent(activity)


@pytest.mark.parametrize("strategy", ONE_GRAB)
def test_a_grab_whose_commit_never_reached_mysql_grants_nothing(
    strategy, mysql_proxy, make_users, sender
):
    activity = send(sender, strategy)
    (user,) = make_users(1)
    connection.ensure_connection()
    mysql_proxy.cut_before(BARE_COMMIT)
    with pytest.raises(OutcomeUnknown):
        grab(activity, user)
    assert mysql_proxy.fired == 1
    assert row_of(activity, user) is None
    assert grab(activity, user).outcome is Outcome.GRABBED
    assert_consistent(activity)


def test_a_cut_commit_is_not_answered_by_another_clicks_row(
    mysql_proxy, make_users, sender, monkeypatch
):
    """`pessimistic`, equal amounts: the grab's COMMIT never reaches MySQL; before MySQL is
    asked, the user's other click (another process, its own transaction) writes the user's
    grab, of the same amount. That row is not this transaction's: no second `grabbed`."""
    activity = send(sender, "pessimistic", allocation_kind="equal")
    (user,) = make_users(1)
    params = connection.settings_dict
    asked = steps.batch_written

    def other_click() -> None:
        other = MySQLdb.connect(  # through the proxy: its one fault has fired
            host=params["HOST"],
            port=int(params["PORT"]),
            user=params["USER"] or "root",
            passwd=params["PASSWORD"] or "",
            db=params["NAME"],
        )
        try:
            cursor = other.cursor()
            steps.execute_raw(
                cursor,
                steps.read_for_grab_sql(activity_id=activity.pk, user_id=user.pk, lock=True),
                begin=True,
            )
            steps.record_grab_raw(cursor, activity_id=activity.pk, row=steps.GrabRow(user.pk, 100))
            cursor.execute("COMMIT")
        finally:
            other.close()

    def other_click_first(**kwargs):  # type: ignore[no-untyped-def]
        with ThreadPoolExecutor(1) as pool:
            pool.submit(other_click).result()
        return asked(**kwargs)

    monkeypatch.setattr(steps, "batch_written", other_click_first)
    connection.ensure_connection()
    mysql_proxy.cut_before(BARE_COMMIT)
    with pytest.raises(OutcomeUnknown):
        grab(activity, user)
    assert mysql_proxy.fired == 1
    assert row_of(activity, user) == 100
    assert grab(activity, user) == GrabResult(Outcome.ALREADY_GRABBED, 100)
    assert_consistent(activity)


def test_a_transaction_that_wrote_nothing_keeps_its_answer_when_its_commit_reply_is_lost(
    mysql_proxy, make_users, sender
):
    """`pessimistic`, a second click: it only read, under the row lock, and its answer stands."""
    activity = send(sender, "pessimistic")
    (user,) = make_users(1)
    first = grab(activity, user)
    assert first.outcome is Outcome.GRABBED
    connection.ensure_connection()
    mysql_proxy.drop_reply(BARE_COMMIT)
    assert grab(activity, user) == GrabResult(Outcome.ALREADY_GRABBED, first.amount_cents)
    assert mysql_proxy.fired == 1
    assert_consistent(activity)


def grabs_once_it_is_back(activity: Activity, user) -> None:  # type: ignore[no-untyped-def]
    """After a grab answered 503, with MySQL back: the user's retry finds or makes the one grab,
    told `grabbed` at most once, and a later retry hears `already_grabbed`."""
    connection.close()
    again = grab(activity, user)
    held = row_of(activity, user)
    assert held is not None
    assert again in {GrabResult(Outcome.GRABBED, held), GrabResult(Outcome.ALREADY_GRABBED, held)}
    assert grab(activity, user) == GrabResult(Outcome.ALREADY_GRABBED, held)
    assert_consistent(activity)


def mysql_away(proxy: FaultProxy, how: str) -> Callable[[], None]:
    """Take MySQL away from this thread's connection (`cut`: no server answers; `at_its_limit`:
    MariaDB holds max_connections and refuses a new login); returns what brings it back."""
    if how == "cut":
        proxy.cut()
        return proxy.restore
    proxy.refuse_logins()
    connection.close()  # the next statement logs in anew, and is refused
    return proxy.heal


AWAY = ["cut", "at_its_limit"]


@pytest.mark.parametrize("away", AWAY)
@pytest.mark.parametrize("strategy", ["group_commit", "pessimistic", "redis_counter"])
@pytest.mark.parametrize("known", [True, False], ids=["known_activity", "first_grab_here"])
def test_a_grab_while_mysql_is_away_is_unknown_and_grabs_once_it_is_back(
    strategy, known, away, mysql_proxy, make_users, sender
):
    """MySQL refuses connections, or takes no more: each grab, a repeated one too, is 503,
    whether the process knew the activity's strategy (`known`) or had to ask MySQL for it; once
    MySQL is back the user has one grab, told once."""
    activity = send(sender, strategy)
    first, user = make_users(2)
    assert grab(activity, first).outcome is Outcome.GRABBED
    if not known:
        selectors.activity_facts.cache_clear()
    back = mysql_away(mysql_proxy, away)
    for _ in range(2):
        with pytest.raises(OutcomeUnknown):
            grab(activity, user)
    back()
    grabs_once_it_is_back(activity, user)


@pytest.fixture
def short_mysql_waits() -> Iterator[None]:
    """MySQL connections give up on a reply, and on a login, after a second (DB_READ_TIMEOUT,
    DB_CONNECT_TIMEOUT)."""
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    options.update(read_timeout=1, write_timeout=1, connect_timeout=1)
    connection.close()
    yield
    options.clear()
    options.update(saved)
    connection.close()


@pytest.mark.parametrize("strategy", ["pessimistic", "redis_counter"])
def test_a_grab_while_mysql_stalls_is_unknown_once_its_wait_ends(
    strategy, mysql_proxy, short_mysql_waits, make_users, sender
):
    """MySQL stops answering without closing (a host gone): the grab gives up on its reply,
    answers 503 and frees its thread; once MySQL answers again the user has one grab, told
    once. Without a bounded wait the grab would wait for TCP to give up."""
    activity = send(sender, strategy)
    first, user = make_users(2)
    assert grab(activity, first).outcome is Outcome.GRABBED
    pool = ThreadPoolExecutor(1)  # one thread, whose connection is open when MySQL stalls
    pool.submit(lambda: connection.ensure_connection()).result()  # the pool thread's own
    mysql_proxy.stall()
    try:
        with pytest.raises(OutcomeUnknown):
            pool.submit(grab, activity, user).result(timeout=120)
        # Its first statement waited out its reply and was not sent again on a new connection
        # (GrabTransaction.waited_out), where it would have waited as long again: no login
        # but the one of a Redis strategy's question about its write.
        logins = [data for login, data in mysql_proxy.swallowed if login]
        started = [data for _, data in mysql_proxy.swallowed if b"START TRANSACTION" in data]
        assert (len(started), len(logins)) == (1, 0 if strategy == "pessimistic" else 1)
    finally:
        mysql_proxy.heal()
        mysql_proxy.cut()  # a grab still waiting finds its connection closed
        pool.shutdown()
    mysql_proxy.restore()
    grabs_once_it_is_back(activity, user)


@pytest.mark.parametrize("away", AWAY)
def test_an_admin_page_while_mysql_is_away_is_a_503_to_retry(away, mysql_proxy, make_users):
    """Outside the API's views too (the admin reads its session and user from MySQL): 503 with
    Retry-After, not a server error; once MySQL is back, the page."""
    (staff,) = make_users(1, prefix="staff")
    staff.is_staff = staff.is_superuser = True
    staff.save()
    client = Client(raise_request_exception=False)  # the answer the browser would get
    client.force_login(staff)
    back = mysql_away(mysql_proxy, away)
    refused = client.get("/admin/")
    assert refused.status_code == 503
    assert refused["Retry-After"] == "1"
    assert b"MySQL or Redis did not answer" in refused.content
    back()
    connection.close()
    assert client.get("/admin/").status_code == 200


def test_health_and_metrics_answer_while_mysql_stalls(mysql_proxy):
    """MySQL stops answering without closing: /healthz says `down` and /metrics says the
    database is not up, each after the probe's own bounded wait (health.PROBE_TIMEOUT), where
    the request's connection would wait DB_READ_TIMEOUT (90 s) or, unset, until TCP gives up;
    /metrics leaves MySQL's gauges out unread. Once MySQL answers, both say so again."""
    client = APIClient()
    assert client.get("/healthz").status_code == 200  # the probe's connection is open
    assert b"redpack_persist_failures" in client.get("/metrics").content
    health.forget_verdict()
    pool = ThreadPoolExecutor(1)  # a web thread, whose own connection is open when MySQL stalls
    pool.submit(lambda: connection.ensure_connection()).result()
    mysql_proxy.stall()
    try:
        healthz = pool.submit(client.get, "/healthz").result(timeout=120)
        scrape = pool.submit(client.get, "/metrics").result(timeout=120)
    finally:
        mysql_proxy.heal()
        mysql_proxy.cut()  # a request still waiting finds its connection closed
        pool.shutdown()
    mysql_proxy.restore()
    assert (healthz.status_code, healthz.json()) == (503, {"status": "down"})
    assert scrape.status_code == 200
    assert b'redpack_up{check="database"} 0.0' in scrape.content
    assert b"redpack_persist_failures" not in scrape.content  # MySQL's, not read
    assert b"redpack_refunds_due" in scrape.content  # the schedule's, in Redis
    # Swallowed: the open probe connection's SELECT 1, then a new one's login; nothing else.
    assert [data[-8:] for login, data in mysql_proxy.swallowed if not login] == [b"SELECT 1"]
    health.forget_verdict()
    assert client.get("/healthz").status_code == 200
    assert b'redpack_up{check="database"} 1.0' in client.get("/metrics").content


@pytest.mark.parametrize("away", AWAY)
@pytest.mark.parametrize("strategy", ["redis_queue_async", "group_commit"])
def test_a_grab_request_while_mysql_is_away_is_a_503_the_client_can_retry(
    strategy, away, mysql_proxy, make_users, sender
):
    """Over HTTP, in a process that has yet to learn the activity's strategy (which only MySQL
    knows): 503 `outcome_unknown` with Retry-After, and the grab once MySQL is back."""
    activity = send(sender, strategy)
    (user,) = make_users(1)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
    selectors.activity_facts.cache_clear()
    back = mysql_away(mysql_proxy, away)
    refused = client.post(f"/api/activities/{activity.pk}/grab/")
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "outcome_unknown"
    assert refused["Retry-After"] == "1"
    back()
    connection.close()
    answered = client.post(f"/api/activities/{activity.pk}/grab/")
    assert answered.status_code == 200 and answered.json()["outcome"] == "grabbed"
    assert_consistent(activity)


@pytest.mark.parametrize("away", AWAY)
def test_the_other_api_calls_while_mysql_is_away_are_a_503_to_retry(
    away, mysql_proxy, make_users, sender
):
    """Reading an activity, a user's grabs, logging in and sending, with MySQL away: 503
    `unavailable` with Retry-After, not a server error; a send, and only a send, says it may or
    may not have been made. Once MySQL is back, the same calls are answered."""
    activity = send(sender, "pessimistic")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(sender)}")
    sender.set_password("secret-pass-1")
    sender.save()
    calls = {
        "activity": lambda: client.get(f"/api/activities/{activity.pk}/"),
        "my grabs": lambda: client.get("/api/me/grabs/"),
        "login": lambda: APIClient().post(
            "/api/token/", {"username": sender.username, "password": "secret-pass-1"}, format="json"
        ),
        "send": lambda: client.post(
            "/api/activities/",
            {"total_amount": "1.00", "total_count": 1, "strategy": "pessimistic"},
            format="json",
        ),
    }
    back = mysql_away(mysql_proxy, away)
    for name, call in calls.items():
        refused = call()
        assert refused.status_code == 503, (name, refused.content)
        error = refused.json()["error"]
        assert error["code"] == "unavailable", name
        assert refused["Retry-After"] == "1", name
        assert ("may or may not have taken effect" in error["message"]) is (name == "send")
    back()
    connection.close()
    answered = {name: call().status_code for name, call in calls.items()}
    assert answered == {"activity": 200, "my grabs": 200, "login": 200, "send": 201}


@pytest.mark.parametrize(("strategy", "made"), [("redis_counter", False), ("pessimistic", True)])
def test_a_send_while_redis_is_away(strategy, made, redis_proxy, sender):
    """A Redis strategy's send asks Redis before it commits: with Redis away, 503 `unavailable`
    (not a server error), and no activity, no debit. A MySQL strategy's send needs no Redis: it
    commits and answers 201 (its expiry is registered from MySQL once due, by the sweep)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(sender)}")
    before = Activity.objects.filter(sender=sender).count()
    redis_proxy.cut()
    answer = client.post(
        "/api/activities/",
        {"total_amount": "1.00", "total_count": 1, "strategy": strategy},
        format="json",
    )
    assert answer.status_code == (201 if made else 503), answer.content
    if not made:
        assert answer.json()["error"]["code"] == "unavailable"
    assert Activity.objects.filter(sender=sender).count() == before + made


def test_a_lock_grab_while_redis_is_away_is_unknown(redis_proxy, make_users, sender):
    activity = send(sender, "distributed_lock")
    (user,) = make_users(1)
    redis_proxy.cut()
    with pytest.raises(OutcomeUnknown):
        grab(activity, user)
    assert row_of(activity, user) is None


def test_a_committed_lock_grab_is_answered_when_its_lock_release_is_lost(
    redis_proxy, make_users, sender
):
    """The grab committed; Redis then drops the connection on the lock's release: the answer is
    the grab, and the lock lapses on its own."""
    activity = send(sender, "distributed_lock")
    (user,) = make_users(1)
    release = hashlib.sha1(Lock.LUA_RELEASE_SCRIPT.encode()).hexdigest().encode()
    redis_proxy.cut_before(release, times=10)  # redis-py's retries included
    answer = grab(activity, user)
    assert redis_proxy.fired >= 1
    assert answer == GrabResult(Outcome.GRABBED, row_of(activity, user))
    assert_consistent(activity)


@pytest.mark.parametrize(
    ("error", "unreachable"),
    [
        (OperationalError(2013, "Lost connection to server during query"), True),
        (OperationalError(2002, "Can't connect to server"), True),
        (OperationalError(1927, "Connection was killed"), True),
        (OperationalError(1040, "Too many connections"), True),
        (OperationalError(1203, "User already has more than 'max_user_connections'"), True),
        (InterfaceError(0, ""), True),
        (OperationalError(1205, "Lock wait timeout exceeded"), False),
        (IntegrityError(1062, "Duplicate entry"), False),
        (RedisConnectionError("Connection refused"), True),
        (RedisTimeoutError("Timeout reading from socket"), True),
        (AuthenticationError("invalid password"), False),
        (ResponseError("NOSCRIPT"), False),
        (ReadOnlyError("You can't write against a read only replica."), True),
        (MasterDownError("Link with MASTER is down"), True),
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), True),
        (ResponseError("BUSY Redis is busy running a script."), True),
        (ResponseError("NOREPLICAS Not enough good replicas to write."), True),
        (ResponseError("MISCONF Redis is configured to save RDB snapshots"), True),
        (TryAgainError("Multiple keys request during rehashing of slot"), True),
        (ClusterDownError("The cluster is down"), True),
        (ResponseError("ERR Error running script: user_script:1: boom"), False),
        (ResponseError("BUSYKEY Target key name already exists."), False),
        (ResponseError("BUSYGROUP Consumer Group name already exists"), False),
    ],
)
def test_what_counts_as_a_store_that_did_not_answer(error, unreachable):
    """What a grab answers 503 `outcome_unknown` for: a connection that failed, or a server
    that takes no command now (at its connection limit, a replica, full), not a refusal of
    this request (a lock wait, a constraint, a wrong password, a script error)."""
    assert services.store_unreachable(error) is unreachable


@pytest.fixture
def own_redis(settings, tmp_path) -> Iterator[Redis]:  # type: ignore[no-untyped-def]
    """A redis-server of the test's own as the app's Redis, for a failover to demote."""
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        + ["--appendonly", "no", "--dir", str(tmp_path), "--logfile", str(tmp_path / "log")]
    )
    client = Redis(port=port)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except RedisConnectionError:
            return False

    try:
        wait_for(answers, f"redis-server on port {port}", timeout=30)
    except Exception:
        server.kill()
        raise
    caches = {name: {**conf} for name, conf in settings.CACHES.items()}
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{port}/0"
    settings.CACHES = caches  # the strategies' client and scripts follow (strategies/lua)
    yield client
    server.terminate()
    server.wait(timeout=30)


def everything_in(client: Redis) -> dict[bytes, bytes | None]:
    """Every key and its value (the send's writability probe aside: it expires at once)."""
    keys = [key for key in client.scan_iter() if key != WRITE_PROBE_KEY.encode()]
    return {key: client.dump(key) for key in keys}


REFUSING = [
    (strategy, refusing)
    for strategy in ("redis_counter", "redis_queue")
    for refusing in ("read_only", "master_down", "full")
]


@pytest.mark.parametrize(("strategy", "refusing"), REFUSING)
def test_a_grab_on_a_redis_that_takes_no_write_is_a_503_that_took_nothing(
    strategy, refusing, own_redis, make_users, sender, settings
):
    """After a failover the app's Redis is a replica of a master it cannot reach: it refuses
    writes (READONLY) or, not serving stale data, every command (MASTERDOWN). Or it is a master
    over its maxmemory (OOM): it runs the grab script, which reads first, and refuses its first
    write, which could grow the data: the request's count for its throttle (checks.lua, with a
    grab rate set, as by default). The grab answers 503
    `outcome_unknown` with Retry-After, not a server error; its script wrote nothing (the keys
    are as they were), and once Redis takes writes again the user has one grab."""
    settings.REDPACK_THROTTLE_RATES = {**settings.REDPACK_THROTTLE_RATES, "grab": "120/min"}
    activity = send(sender, strategy)
    first, user = make_users(2)
    assert grab(activity, first).outcome is Outcome.GRABBED
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
    before = everything_in(own_redis)
    if refusing == "full":
        own_redis.config_set("maxmemory", 1)  # bytes: every write that may grow it is refused
    else:
        own_redis.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # nobody listens
    if refusing == "master_down":
        own_redis.config_set("replica-serve-stale-data", "no")
    try:
        refused = client.post(f"/api/activities/{activity.pk}/grab/")
    finally:
        own_redis.config_set("maxmemory", 0)
        own_redis.config_set("replica-serve-stale-data", "yes")
        own_redis.execute_command("REPLICAOF", "NO", "ONE")
    assert refused.status_code == 503, refused.content
    assert refused.json()["error"]["code"] == "outcome_unknown"
    assert refused["Retry-After"] == "1"
    assert everything_in(own_redis) == before
    assert row_of(activity, user) is None
    grabs_once_it_is_back(activity, user)


@pytest.mark.parametrize("refusing", ["read_only", "full"])
def test_a_send_on_a_redis_that_takes_no_write_is_a_503_that_sent_nothing(
    refusing, own_redis, sender
):
    """A replica after a failover, or a Redis at its maxmemory, answers a PING; a Redis
    strategy's send asks it for a write before it commits, so it answers 503 `unavailable`:
    no activity, no debit, where a PING let it commit an activity whose state could not be
    written (every grab `contended` until a rebuild). /healthz says Redis is down meanwhile."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(sender)}")
    before = Activity.objects.filter(sender=sender).count()
    if refusing == "full":
        own_redis.config_set("maxmemory", 1)
    else:
        own_redis.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    try:
        answer = client.post(
            "/api/activities/",
            {"total_amount": "1.00", "total_count": 1, "strategy": "redis_counter"},
            format="json",
        )
        health.forget_verdict()
        verdict = APIClient().get("/healthz")
    finally:
        own_redis.config_set("maxmemory", 0)
        own_redis.execute_command("REPLICAOF", "NO", "ONE")
    assert answer.status_code == 503, answer.content
    assert answer.json()["error"]["code"] == "unavailable"
    assert Activity.objects.filter(sender=sender).count() == before
    assert (verdict.status_code, verdict.json()) == (503, {"status": "down"})


def test_a_script_whose_first_write_redis_takes_at_maxmemory_runs_whole(
    own_redis, make_users, sender
):
    """Without a throttle count to make first (no grab rate set, as here; a grab made in the
    service, or a re-run), `redis_queue`'s grab script first takes the popped packets off the
    list (LTRIM), a write that frees memory, which Redis takes at its maxmemory; once a script
    has written, Redis refuses none of its writes (no script stops halfway). So the grab is
    made whole, and written to MySQL: one grab, in both stores."""
    activity = send(sender, "redis_queue")
    (user,) = make_users(1)
    own_redis.config_set("maxmemory", 1)
    try:
        answer = grab(activity, user)
    finally:
        own_redis.config_set("maxmemory", 0)
    assert answer == GrabResult(Outcome.GRABBED, row_of(activity, user))
    assert grab(activity, user) == GrabResult(Outcome.ALREADY_GRABBED, row_of(activity, user))
    assert_consistent(activity)
