"""What this machine can do at best, at the bench's concurrency, without our Python in the way.

- Redis: one grab script by EVALSHA, driven by redis-benchmark (C): the strategy's own script
  when STRATEGY_SCRIPTS names one, else a representative pop + hset script.
- MySQL: `UPDATE hot_row SET n = n + 1 WHERE id = 1` from many connections (mysqlslap, or a
  Python loop when mysqlslap is missing): the hand-off rate of one hot row, which bounds every
  strategy that writes the activity row per grab.
- MySQL, raw: a grab's own statements from plain mysqlclient threads on the project's tables,
  one grab per transaction (the seeds' row-lock shape) or 32 (group commit's); and each seed's
  own statements (GrabStrategy.raw_grab, built by the same `*_sql` functions its grab runs),
  and each batched strategy's own batch transaction, 32 grabs each (GrabStrategy.raw_batch).
- Web: GET /api/ping/ through gunicorn (run by compare with Locust, see locustfiles/ping.py).
"""

import csv
import io
import os
import re
import resource
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import MySQLdb
import MySQLdb.cursors
from django.conf import settings
from django.test.utils import override_settings
from django_redis import get_redis_connection

from redpack import dberrors, services
from redpack.models import Activity, GrabDetail, Packet
from redpack.money import to_cents
from strategies import lua, registry

from . import processes
from .users import bench_sender, bench_users_ensure

LAB = Path(__file__).resolve().parent
STRATEGIES_LUA = Path(registry.__file__).resolve().parent / "lua"
REPRESENTATIVE_SCRIPT = LAB / "ceiling_grab.lua"
USER_RANGE = 1_000_000_000  # redis-benchmark's __rand_int__ range: users rarely repeat

_STATE = (
    "rp:{$activity}:meta",
    "rp:{$activity}:count",
    "rp:{$activity}:grabbed",
    "rp:{$activity}:packets",
)
# The Redis strategies' own grab scripts, as redis-benchmark runs them against an activity the
# strategy prepared: script (strategies/lua/), number of KEYS, then KEYS and ARGV (each
# script's header says which), with $activity, $user (a random user) and $now_ms filled in.
# The others have none (MySQL does their work; distributed_lock's Redis part is redis-py's Lock).
# A batch of one user per call: the one-grab-per-round-trip rate the batched strategies aim past.
STRATEGY_SCRIPTS: dict[str, tuple[str, ...]] = {
    "redis_counter": (
        "grab.lua",
        "4",
        *_STATE,
        "$now_ms",
        "draw",
        "12345",
        "$user",
        "$user",  # the attempt token: a user drawn again re-runs its attempt (one answer)
        "",  # no request checks: the bench's grabs make none
    ),
    "redis_queue": ("grab.lua", "4", *_STATE, "$now_ms", "pop", "0", "$user", "$user", ""),
    "redis_queue_single": ("grab.lua", "4", *_STATE, "$now_ms", "pop", "0", "$user", "$user", ""),
    "redis_queue_async": (
        "grab.lua",
        "5",
        *_STATE,
        "rp:{$activity}:persist",
        "$now_ms",
        "pop",
        "0",
        "$user",
        "$user",
        "",
    ),
}


@dataclass
class Ceiling:
    name: str
    kind: str  # "redis", "mysql…" (mysql, mysql_raw, …) or "web…" (web, web_wrk, web_burst)
    tool: str
    requests_per_s: float | None
    p50_ms: float | None = None
    p99_ms: float | None = None
    note: str = ""
    strategy: str | None = None  # set for a strategy's own Redis script
    # A ping's requests that got no 200 (lost, reset or refused): every request of a no-op must
    # be answered, and `compare` fails on one that was not.
    failed: int = 0


def redis_representative(*, requests: int, concurrency: int) -> Ceiling:
    """The representative script over `requests` packets, in scratch keys removed afterwards."""
    client = get_redis_connection("default")
    tag = f"rpceiling:{{{os.getpid()}}}"
    keys = [f"{tag}:packets", f"{tag}:grabbed", f"{tag}:persist"]
    client.delete(*keys)
    for start in range(0, requests, 10_000):
        client.rpush(keys[0], *(["100"] * min(10_000, requests - start)))
    try:
        return _redis_script(
            name="Redis: representative grab script (RPOP + HSET + LPUSH)",
            script=REPRESENTATIVE_SCRIPT.read_text(),
            args=["3", *keys, "__rand_int__"],
            requests=requests,
            concurrency=concurrency,
            note="redpack/lab/ceiling_grab.lua; used for strategies without a script of their own",
        )
    finally:
        client.delete(*keys)


def redis_strategy(name: str, *, requests: int, concurrency: int) -> Ceiling | None:
    """The strategy's own grab script against a real activity of `requests` packets."""
    spec = STRATEGY_SCRIPTS.get(name)
    if not spec:
        return None
    title = f"Redis: {name} ({spec[0]})"
    if not (STRATEGIES_LUA / spec[0]).exists():
        note = f"{STRATEGIES_LUA / spec[0]} not found"
        return Ceiling(title, "redis", "redis-benchmark", None, note=note, strategy=name)
    activity = _ceiling_activity(name, requests)
    now = time.time()
    values = {  # $now_ms before $now, its prefix
        "$activity": str(activity.pk),
        "$user": "__rand_int__",
        "$now_ms": str(int(now * 1000)),
        "$now": str(int(now)),
    }
    args = [_substitute(arg, values) for arg in spec[1:]]
    try:
        ceiling = _redis_script(
            name=title,
            script=lua.source(spec[0].removesuffix(".lua")),
            args=args,
            requests=requests,
            concurrency=concurrency,
            note=f"activity of {requests} packets prepared by the strategy, then removed",
        )
    finally:
        _remove_activity(activity.pk)
    ceiling.strategy = name
    return ceiling


def _ceiling_activity(strategy: str, packets: int) -> Activity:
    """An activity of `packets` packets of 1.00, prepared by `strategy`, for a ceiling to grab
    (removed afterwards by _remove_activity)."""
    with override_settings(
        REDPACK_MAX_COUNT=max(packets, settings.REDPACK_MAX_COUNT),
        REDPACK_ALLOW_UNSAFE_STRATEGIES=True,
    ):
        return services.activity_send(
            sender_id=bench_sender().pk,
            total_amount=Decimal(packets),
            total_count=packets,
            strategy=strategy,
            expires_in=3600,
            funded=False,  # removed afterwards: no money moves for it
        )


def _substitute(arg: str, values: dict[str, str]) -> str:
    for placeholder, value in values.items():
        arg = arg.replace(placeholder, value)
    return arg


def _remove_activity(activity_id: int) -> None:
    """The ceiling's activity is not a real one: drop its Redis keys, its grab rows, its
    packets and itself."""
    client = get_redis_connection("default")
    keys = list(client.scan_iter(match=f"*{{{activity_id}}}*", count=1000))
    if keys:
        client.delete(*keys)
    GrabDetail.objects.filter(activity_id=activity_id).delete()
    Packet.objects.filter(activity_id=activity_id).delete()
    Activity.objects.filter(pk=activity_id).delete()


def _redis_script(
    *, name: str, script: str, args: Sequence[str], requests: int, concurrency: int, note: str
) -> Ceiling:
    """`script` (its text) by EVALSHA from redis-benchmark, `args` after the sha."""
    tool = shutil.which("redis-benchmark")
    if tool is None:
        return Ceiling(name, "redis", "redis-benchmark", None, note="redis-benchmark not found")
    client = get_redis_connection("default")
    sha = client.script_load(script)
    where = client.connection_pool.connection_kwargs
    command = [tool, "-h", str(where.get("host", "127.0.0.1")), "-p", str(where.get("port", 6379))]
    command += ["--dbnum", str(where.get("db", 0))]
    if where.get("password"):
        command += ["-a", str(where["password"])]
        if where.get("username"):
            command += ["--user", str(where["username"])]
    command += ["-n", str(requests), "-c", str(concurrency), "-r", str(USER_RANGE), "--csv"]
    command += ["EVALSHA", sha, *args]
    done = processes.run(command, timeout=600)
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    if done.returncode != 0 or not rows:
        detail = (done.stderr or done.stdout).strip()[-300:]
        return Ceiling(name, "redis", "redis-benchmark", None, note=f"failed: {detail}")
    row = rows[-1]
    return Ceiling(
        name,
        "redis",
        f"redis-benchmark -c {concurrency} -n {requests}",
        float(row["rps"]),
        p50_ms=float(row["p50_latency_ms"]),
        p99_ms=float(row["p99_latency_ms"]),
        note=note,
    )


def web_wrk(*, url: str, authorization: str, seconds: int, connections: int) -> Ceiling:
    """GET `url` (the ping) from wrk, a C load generator that costs the server's machine far
    less CPU per request than Locust: the web server's ceiling with the generator out of the
    way, next to Locust's. wrk's own CPU is measured (its share of its 2 threads' cores)."""
    name = "Web: GET /api/ping/ (JWT, one Redis round trip), wrk"
    tool = shutil.which("wrk")
    if tool is None:
        return Ceiling(name, "web_wrk", "wrk", None, note="wrk not found (apt-get install wrk)")
    threads = 2
    command = [tool, "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s"]
    command += ["--latency", "-H", f"Authorization: {authorization}", url]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = processes.run(command, timeout=seconds + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if done.returncode != 0 or rate is None:
        detail = (done.stderr or done.stdout).strip()[-300:]
        return Ceiling(name, "web_wrk", "wrk", None, note=f"failed: {detail}")
    note = f"wrk's own CPU {100 * cpu / (seconds * threads):.0f}% of {threads} cores"
    refused, unanswered = wrk_failures(done.stdout)
    if refused:
        note += f"; {refused:,} non-2xx answers"
    if unanswered:
        note += f"; {unanswered:,} connection errors (a request without an answer)"
    return Ceiling(
        name,
        "web_wrk",
        f"wrk -t{threads} -c{connections} -d{seconds}s",
        float(rate.group(1)),
        p50_ms=_wrk_ms(done.stdout, "50%"),
        p99_ms=_wrk_ms(done.stdout, "99%"),
        note=note,
        failed=refused + unanswered,
    )


def wrk_failures(output: str) -> tuple[int, int]:
    """From wrk's report: its non-2xx answers, and its connect, read and write errors (a kept
    connection that broke with its request unanswered, or one that could not be opened).
    Timeouts are not among them: wrk counts a request slower than its timeout and keeps
    waiting for its answer."""
    refused = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+)", output)
    broken = sum(int(n) for n in errors.groups()) if errors else 0
    return (int(refused.group(1)) if refused else 0), broken


def _wrk_ms(output: str, percentile: str) -> float | None:
    """A latency percentile of wrk's --latency table ("50%  1.23ms"), in ms."""
    found = re.search(rf"^\s*{re.escape(percentile)}\s+([\d.]+)(us|ms|s)\s*$", output, re.M)
    if found is None:
        return None
    value, unit = float(found.group(1)), found.group(2)
    return round(value * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit], 3)


HOT_ROW_TABLE = "CREATE TABLE hot_row (id INT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB"
HOT_ROW_UPDATE = "UPDATE hot_row SET n = n + 1 WHERE id = 1"


def mysql_hot_row(*, queries: int, concurrency: int) -> Ceiling:
    """Autocommitted UPDATEs of one row from `concurrency` connections, in a scratch schema."""
    db = settings.DATABASES["default"]
    name = "MySQL: hot-row UPDATE (autocommit)"
    if db["ENGINE"] != "django.db.backends.mysql":
        return Ceiling(name, "mysql", "-", None, note="not a MySQL database")
    schema = f"{db['NAME']}_ceiling"
    tool = shutil.which("mysqlslap") or shutil.which("mariadb-slap")
    if tool:
        return _mysqlslap(tool, db, schema, name=name, queries=queries, concurrency=concurrency)
    return _python_hot_row(db, schema, name=name, queries=queries, concurrency=concurrency)


def _mysqlslap(
    tool: str, db: dict, schema: str, *, name: str, queries: int, concurrency: int
) -> Ceiling:
    command = [
        tool,
        f"--host={db.get('HOST') or '127.0.0.1'}",
        f"--port={db.get('PORT') or 3306}",
        f"--user={db.get('USER') or 'root'}",
        f"--create-schema={schema}",  # created and dropped by mysqlslap
        f"--create={HOT_ROW_TABLE};INSERT INTO hot_row VALUES (1, 0)",
        f"--query={HOT_ROW_UPDATE}",
        f"--concurrency={concurrency}",
        f"--number-of-queries={queries}",
        "--iterations=1",
        "--delimiter=;",
    ]
    env = {**os.environ, "MYSQL_PWD": db.get("PASSWORD") or ""}
    done = processes.run(command, timeout=1800, env=env)
    seconds = re.search(r"Average number of seconds to run all queries: ([\d.]+)", done.stdout)
    per_client = re.search(r"Average number of queries per client: (\d+)", done.stdout)
    if done.returncode != 0 or not seconds or not per_client or float(seconds.group(1)) == 0:
        detail = (done.stderr or done.stdout).strip()[-300:]
        return Ceiling(name, "mysql", "mysqlslap", None, note=f"failed: {detail}")
    total = int(per_client.group(1)) * concurrency
    return Ceiling(
        name,
        "mysql",
        f"mysqlslap -c {concurrency}",
        round(total / float(seconds.group(1)), 1),
        note=f"{total} UPDATEs of one row in a scratch schema",
    )


def _connect(db: dict, database: str | None = None, *, autocommit: bool) -> MySQLdb.Connection:
    """A plain mysqlclient connection to the configured server, without Django."""
    kwargs = {"database": database} if database else {}
    return MySQLdb.connect(
        host=db.get("HOST") or "127.0.0.1",
        port=int(db.get("PORT") or 3306),
        user=db.get("USER") or "root",
        password=db.get("PASSWORD") or "",
        autocommit=autocommit,
        **kwargs,
    )


def _timed_threads(
    work: Callable[[int, MySQLdb.Connection, threading.Barrier], None],
    connections: list[MySQLdb.Connection],
) -> float:
    """Seconds from one start signal until every connection's thread finished `work(index,
    connection, start)` (each waits on `start` before its first statement); then the
    connections are closed."""
    start = threading.Barrier(len(connections) + 1)
    errors: list[BaseException] = []

    def run(index: int, conn: MySQLdb.Connection) -> None:
        try:
            work(index, conn, start)
        except BaseException as exc:  # re-raised below: a thread that died did not finish
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=run, args=(i, conn)) for i, conn in enumerate(connections)]
    try:
        for thread in threads:
            thread.start()
        start.wait()
        began = time.monotonic()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return time.monotonic() - began
    finally:
        for conn in connections:
            conn.close()


def _python_hot_row(db: dict, schema: str, *, name: str, queries: int, concurrency: int) -> Ceiling:
    admin = _connect(db, autocommit=True)
    cursor = admin.cursor()
    cursor.execute(f"DROP SCHEMA IF EXISTS `{schema}`")
    cursor.execute(f"CREATE SCHEMA `{schema}`")
    cursor.execute(f"CREATE TABLE `{schema}`.{HOT_ROW_TABLE.removeprefix('CREATE TABLE ')}")
    cursor.execute(f"INSERT INTO `{schema}`.hot_row VALUES (1, 0)")
    each = max(1, queries // concurrency)
    connections = [_connect(db, schema, autocommit=True) for _ in range(concurrency)]

    def hammer(index: int, conn: MySQLdb.Connection, start: threading.Barrier) -> None:
        own = conn.cursor()
        start.wait()
        for _ in range(each):
            own.execute(HOT_ROW_UPDATE)

    seconds = _timed_threads(hammer, connections)
    cursor.execute(f"DROP SCHEMA `{schema}`")
    admin.close()
    return Ceiling(
        name,
        "mysql",
        f"Python threads -c {concurrency} (mysqlslap not found)",
        round(each * concurrency / seconds, 1),
        note="includes Python's cost per statement",
    )


def mysql_raw_grabs(*, per_transaction: int, grabs: int, concurrency: int) -> Ceiling:
    """A grab's SQL without this project's Python: plain mysqlclient threads on the project's
    own tables (a real activity of `grabs` packets, real bench users, every constraint and
    index), each transaction taking `per_transaction` grabs of the hot activity row: lock the
    row, look up the users, decrement, insert their rows, commit. One grab per transaction is
    the seeds' shape (pessimistic's statements); 32 is group commit's batch, with its lookup as
    a statement of its own (group_commit makes it a subquery of the row's lock: one statement
    fewer). The activity and its rows are removed afterwards."""
    db = settings.DATABASES["default"]
    kind = "mysql_raw" if per_transaction == 1 else "mysql_raw_batched"
    name = f"MySQL: raw grab transaction, {per_transaction} grab(s) each"
    if db["ENGINE"] != "django.db.backends.mysql":
        return Ceiling(name, kind, "-", None, note="not a MySQL database")
    transactions = max(1, grabs // (per_transaction * concurrency))
    total = transactions * per_transaction * concurrency
    user_ids, _ = bench_users_ensure(count=total)
    activity = _ceiling_activity("pessimistic", total)
    activities, details = Activity._meta.db_table, GrabDetail._meta.db_table
    connections = [_connect(db, db["NAME"], autocommit=False) for _ in range(concurrency)]

    def grab_loop(index: int, conn: MySQLdb.Connection, start: threading.Barrier) -> None:
        own = conn.cursor()
        marks = ", ".join(["%s"] * per_transaction)
        start.wait()
        for t in range(transactions):
            first = (index * transactions + t) * per_transaction
            users = user_ids[first : first + per_transaction]
            own.execute(
                f"SELECT status, expires_at, surplus_count, surplus_amount FROM {activities}"
                " WHERE id = %s FOR UPDATE",
                (activity.pk,),
            )
            own.execute(
                f"SELECT user_id, amount FROM {details}"
                f" WHERE activity_id = %s AND user_id IN ({marks})",
                (activity.pk, *users),
            )
            own.execute(
                f"UPDATE {activities} SET surplus_count = surplus_count - %s,"
                " surplus_amount = surplus_amount - %s, version = version + 1 WHERE id = %s",
                (per_transaction, per_transaction, activity.pk),
            )
            own.executemany(  # mysqlclient sends one multi-row INSERT
                f"INSERT INTO {details} (activity_id, user_id, amount, created_at)"
                " VALUES (%s, %s, 1.00, NOW(6))",
                [(activity.pk, user) for user in users],
            )
            conn.commit()

    try:
        seconds = _timed_threads(grab_loop, connections)
    finally:
        _remove_activity(activity.pk)
    return Ceiling(
        name,
        kind,
        f"mysqlclient threads -c {concurrency}",
        round(total / seconds, 1),
        note=f"{total} grabs on the project's tables (Python's own cost per statement included)",
    )


def batch_strategies(names: list[str]) -> list[str]:
    """The strategies among `names` with a batched raw same-SQL ceiling (GrabStrategy.raw_batch)."""
    return [name for name in names if registry.get(name).raw_batch is not None]


def mysql_raw_batch(name: str, *, per_transaction: int, grabs: int, concurrency: int) -> Ceiling:
    """`name`'s own batch transaction (its raw_batch: the statements of its group commit, built
    by the same `*_sql` functions) from plain mysqlclient threads, `per_transaction` grabs per
    transaction, on one activity of `grabs` packets the strategy prepared: what the batch's SQL
    costs without Django and the rest of this project's Python. Each connection writes its own
    users' grabs, with its own share of the pre-split packets when the strategy cut them (read
    before the clock starts; Redis decided them in the strategy, here nobody needs to). The
    activity is removed afterwards."""
    db = settings.DATABASES["default"]
    title = f"MySQL: raw {name} batch transaction, {per_transaction} grabs each"
    raw_batch = registry.get(name).raw_batch
    if db["ENGINE"] != "django.db.backends.mysql" or raw_batch is None:
        return _not_measured(title, "mysql_raw_batch_own", name, has_own=raw_batch is not None)
    transactions = max(1, grabs // (per_transaction * concurrency))
    total = transactions * per_transaction * concurrency
    user_ids, _ = bench_users_ensure(count=total)
    activity = _ceiling_activity(name, total)
    packets = list(
        Packet.objects.filter(activity_id=activity.pk).order_by("pk").values_list("pk", "amount")
    )
    decided: list[tuple[int, int, int | None]] = [
        (user, to_cents(packets[i][1]), packets[i][0]) if packets else (user, 100, None)
        for i, user in enumerate(user_ids[:total])
    ]
    connections = [_connect(db, db["NAME"], autocommit=True) for _ in range(concurrency)]

    def batch_loop(index: int, conn: MySQLdb.Connection, start: threading.Barrier) -> None:
        own = conn.cursor()
        start.wait()
        for t in range(transactions):
            first = (index * transactions + t) * per_transaction
            raw_batch(own, activity_id=activity.pk, grabs=decided[first : first + per_transaction])

    try:
        seconds = _timed_threads(batch_loop, connections)
    finally:
        _remove_activity(activity.pk)
    return _own_sql(title, "mysql_raw_batch_own", name, concurrency, total, seconds)


def raw_strategies(names: list[str]) -> list[str]:
    """The strategies among `names` with a raw same-SQL ceiling (GrabStrategy.raw_grab)."""
    return [name for name in names if registry.get(name).raw_grab is not None]


def mysql_raw_seed(name: str, *, grabs: int, concurrency: int) -> Ceiling:
    """`name`'s own statements (its raw_grab, built by the same `*_sql` functions its grab
    runs) from plain mysqlclient threads, each of `concurrency` connections grabbing for its
    own users on one activity of `grabs` packets the strategy prepared, until every user
    grabbed once: what the strategy's SQL costs without Django and the rest of this project's
    Python. A deadlock runs that grab again; the activity is removed afterwards."""
    db = settings.DATABASES["default"]
    title = f"MySQL: raw {name} statements, 1 grab each"
    raw_grab = registry.get(name).raw_grab
    if db["ENGINE"] != "django.db.backends.mysql" or raw_grab is None:
        return _not_measured(title, "mysql_raw_seed", name, has_own=raw_grab is not None)
    each = max(1, grabs // concurrency)
    total = each * concurrency
    user_ids, _ = bench_users_ensure(count=total)
    activity = _ceiling_activity(name, total)
    connections = [_connect(db, db["NAME"], autocommit=True) for _ in range(concurrency)]
    deadlocks = []

    def grab_loop(index: int, conn: MySQLdb.Connection, start: threading.Barrier) -> None:
        own = conn.cursor()
        start.wait()
        for user in user_ids[index * each : (index + 1) * each]:
            while True:
                try:
                    raw_grab(own, activity_id=activity.pk, user_id=user)
                    break
                except MySQLdb.OperationalError as exc:
                    if dberrors.code(exc) != dberrors.DEADLOCK:
                        raise
                    own.execute("ROLLBACK")  # InnoDB rolled it back already; run it again
                    deadlocks.append(user)

    try:
        seconds = _timed_threads(grab_loop, connections)
    finally:
        _remove_activity(activity.pk)
    ceiling = _own_sql(title, "mysql_raw_seed", name, concurrency, total, seconds)
    if deadlocks:
        ceiling.note += f"; {len(deadlocks)} deadlocks, run again"
    return ceiling


def _not_measured(title: str, kind: str, name: str, *, has_own: bool) -> Ceiling:
    """A strategy's own-SQL ceiling that cannot be measured: off MySQL, or the strategy has no
    raw statements of that kind (`has_own` False)."""
    note = "not a MySQL database" if has_own else "no raw statements of its own"
    return Ceiling(title, kind, "-", None, note=note, strategy=name)


def _own_sql(
    title: str, kind: str, name: str, concurrency: int, total: int, seconds: float
) -> Ceiling:
    """A strategy's own statements, `total` grabs in `seconds` from plain mysqlclient threads."""
    return Ceiling(
        title,
        kind,
        f"mysqlclient threads -c {concurrency}",
        round(total / seconds, 1),
        note=f"{total} grabs on the project's tables (Python's own cost per statement included)",
        strategy=name,
    )
