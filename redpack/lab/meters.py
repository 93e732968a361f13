"""Resource counters read before and after a run: MySQL statements, Redis commands, CPU.

MySQL and Redis counters are server-wide: on a shared machine they include other clients'
work, so figures taken there are indicative. The snapshots subtract their own reads.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import psutil
from django.conf import settings
from django.db import connection
from django_redis import get_redis_connection

LOCAL_HOSTS = {"", "127.0.0.1", "localhost", "::1"}
MYSQL_SERVER_NAMES = {"mariadbd", "mysqld"}


@dataclass(frozen=True)
class Snapshot:
    mysql_questions: int | None
    redis_commands: int
    redis_cpu: float
    mysql_cpu: float | None
    watched_cpu: float


@dataclass(frozen=True)
class Usage:
    mysql_queries: int | None
    redis_commands: int
    redis_cpu: float
    mysql_cpu: float | None
    watched_cpu: float


def mysql_questions() -> int | None:
    """Server-wide statement count (SHOW GLOBAL STATUS LIKE 'Questions'); None off MySQL."""
    if connection.vendor != "mysql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])


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
        info = get_redis_connection("default").info()
        return Snapshot(
            mysql_questions=mysql_questions(),
            redis_commands=int(info["total_commands_processed"]),
            redis_cpu=float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            mysql_cpu=cpu_seconds([self.mysql]) if self.mysql else None,
            watched_cpu=cpu_seconds(self.watch),
        )

    @staticmethod
    def usage(before: Snapshot, after: Snapshot, *, own_mysql_statements: int = 0) -> Usage:
        """Deltas without the meters' own reads (`own_mysql_statements`: others' extra reads)."""
        mysql = None
        if before.mysql_questions is not None and after.mysql_questions is not None:
            # The closing SHOW GLOBAL STATUS counts itself.
            mysql = after.mysql_questions - before.mysql_questions - 1 - own_mysql_statements
        return Usage(
            mysql_queries=mysql,
            # The closing INFO counts the opening one.
            redis_commands=after.redis_commands - before.redis_commands - 1,
            redis_cpu=after.redis_cpu - before.redis_cpu,
            mysql_cpu=(
                after.mysql_cpu - before.mysql_cpu
                if before.mysql_cpu is not None and after.mysql_cpu is not None
                else None
            ),
            watched_cpu=after.watched_cpu - before.watched_cpu,
        )
