"""Resource counters read before and after a run: MySQL statements, Redis commands, CPU.

MySQL and Redis counters are server-wide: on a shared machine they include other clients'
work, so figures taken there are indicative. The snapshots subtract their own reads.

The machine's own CPU time is read too (`MachineTimes`): how busy it was over the run, and the
share the hypervisor gave other guests while this one wanted to run (steal). On a virtual
machine steal comes and goes with the neighbours' load (measured here: 3 % in one ten-second
run, 12 % in the next), and a run that lost more of it to them is slower for that alone.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil
from django.conf import settings
from django.db import connection
from django_redis import get_redis_connection

LOCAL_HOSTS = {"", "127.0.0.1", "localhost", "::1"}
MYSQL_SERVER_NAMES = {"mariadbd", "mysqld"}


@dataclass(frozen=True)
class MachineTimes:
    """The machine's CPU seconds since boot, over all cores (psutil.cpu_times): all of them,
    idle (idle and iowait), and steal (wanted by this guest, given to another by the
    hypervisor; 0 off a virtual machine)."""

    total: float
    idle: float
    steal: float


def machine_times() -> MachineTimes:
    times = psutil.cpu_times()
    # On Linux a guest's time is inside user and nice already (psutil counts it apart too).
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return MachineTimes(total, idle, getattr(times, "steal", 0.0))


def machine_shares(before: MachineTimes, after: MachineTimes) -> dict[str, float | None]:
    """`machine_busy_share`: the share of the machine's CPU time between the two readings that
    was not idle (steal included: the guest wanted to run); `steal_share`: the share the
    hypervisor took. None for both when no time passed."""
    total = after.total - before.total
    if total <= 0:
        return {"machine_busy_share": None, "steal_share": None}
    return {
        "machine_busy_share": round(1 - (after.idle - before.idle) / total, 3),
        "steal_share": round((after.steal - before.steal) / total, 3),
    }


@dataclass(frozen=True)
class Snapshot:
    mysql_questions: int | None
    row_lock_time_ms: int | None
    row_lock_waits: int | None
    redis_evalsha_usec: int
    redis_commands: int
    redis_cpu: float
    mysql_cpu: float | None
    watched_cpu: float
    machine: MachineTimes


@dataclass(frozen=True)
class Usage:
    mysql_queries: int | None
    row_lock_time_ms: int | None
    row_lock_waits: int | None
    redis_evalsha_usec: int
    redis_commands: int
    redis_cpu: float
    mysql_cpu: float | None
    watched_cpu: float
    machine_busy_share: float | None
    steal_share: float | None


GLOBAL_STATUS = ("Questions", "Innodb_row_lock_time", "Innodb_row_lock_waits")


def mysql_status() -> dict[str, int]:
    """Server-wide counters in one statement (the statement count, InnoDB's row-lock waits);
    empty off MySQL."""
    if connection.vendor != "mysql":
        return {}
    names = ", ".join(f"'{name}'" for name in GLOBAL_STATUS)
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})")
        return {name: int(value) for name, value in cursor.fetchall()}


def redis_evalsha_usec(client: Any) -> int:
    """Microseconds Redis spent running EVALSHA calls since its start (INFO commandstats)."""
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("usec", 0))


def mysql_session_questions() -> int | None:
    """This connection's statement count, including this statement."""
    if connection.vendor != "mysql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])


def mysql_server_process() -> psutil.Process | None:
    """The local MariaDB/MySQL server process, when the database is on this machine."""
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.mysql" or (db.get("HOST") or "") not in LOCAL_HOSTS:
        return None
    found = [p for p in psutil.process_iter(["name"]) if p.info["name"] in MYSQL_SERVER_NAMES]
    return found[0] if len(found) == 1 else None


def cpu_seconds(processes: Iterable[psutil.Process]) -> float:
    """User + system CPU of the processes and their live children."""
    total = 0.0
    seen: set[int] = set()
    for process in processes:
        try:
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
        for member in family:
            if member.pid in seen:
                continue
            seen.add(member.pid)
            try:
                times = member.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


class Meters:
    """Snapshots of the counters; `usage(before, after)` is what happened in between."""

    def __init__(self, watch: Iterable[psutil.Process] = ()) -> None:
        self.watch = list(watch)
        self.mysql = mysql_server_process()

    def snapshot(self) -> Snapshot:
        client = get_redis_connection("default")
        info = client.info()
        status = mysql_status()
        return Snapshot(
            mysql_questions=status.get("Questions"),
            row_lock_time_ms=status.get("Innodb_row_lock_time"),
            row_lock_waits=status.get("Innodb_row_lock_waits"),
            redis_evalsha_usec=redis_evalsha_usec(client),
            redis_commands=int(info["total_commands_processed"]),
            redis_cpu=float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            mysql_cpu=cpu_seconds([self.mysql]) if self.mysql else None,
            watched_cpu=cpu_seconds(self.watch),
            machine=machine_times(),
        )

    @staticmethod
    def usage(before: Snapshot, after: Snapshot, *, own_mysql_statements: int = 0) -> Usage:
        """Deltas without the meters' own reads (`own_mysql_statements`: others' extra reads)."""
        mysql = None
        if before.mysql_questions is not None and after.mysql_questions is not None:
            # The closing SHOW GLOBAL STATUS counts itself.
            mysql = after.mysql_questions - before.mysql_questions - 1 - own_mysql_statements

        def delta(name: str) -> int | None:
            first, last = getattr(before, name), getattr(after, name)
            return None if first is None or last is None else last - first

        return Usage(
            mysql_queries=mysql,
            row_lock_time_ms=delta("row_lock_time_ms"),
            row_lock_waits=delta("row_lock_waits"),
            redis_evalsha_usec=after.redis_evalsha_usec - before.redis_evalsha_usec,
            # The closing INFO counts the opening INFO and INFO commandstats.
            redis_commands=after.redis_commands - before.redis_commands - 2,
            redis_cpu=after.redis_cpu - before.redis_cpu,
            mysql_cpu=(
                after.mysql_cpu - before.mysql_cpu
                if before.mysql_cpu is not None and after.mysql_cpu is not None
                else None
            ),
            watched_cpu=after.watched_cpu - before.watched_cpu,
            **machine_shares(before.machine, after.machine),
        )
