"""System checks of the deployment's shape that settings alone cannot enforce."""

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks

from redpack import dberrors


def _redis_database(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    return (parts.hostname or "localhost", parts.port or 6379, parts.path.strip("/") or "0")


def check_celery_broker_apart(**kwargs: object) -> list[checks.CheckMessage]:
    """The Celery broker must not share a Redis database with the packet state: a FLUSHDB or a
    memory limit meant for one would hit the other (and the state runs with noeviction)."""
    broker = settings.CELERY_BROKER_URL
    state = settings.CACHES["default"]["LOCATION"]
    if broker.startswith("redis") and _redis_database(broker) == _redis_database(state):
        return [
            checks.Error(
                f"CELERY_BROKER_URL {broker!r} is the packet state's Redis database",
                hint="Point CELERY_BROKER_URL at another database number (or server).",
                id="redpack.E010",
            )
        ]
    return []


def mysql_room(cursor: Any) -> tuple[int, int]:
    """MySQL's max_connections and the connections it holds now, read on a DB-API cursor."""
    cursor.execute("SELECT @@max_connections")
    (limit,) = cursor.fetchone()
    cursor.execute("SHOW STATUS LIKE 'Threads_connected'")
    (_, connected) = cursor.fetchone()
    return int(limit), int(connected)


def mysql_short_of(threads: int) -> list[str]:
    """For each MySQL server of the settings that has room for fewer connections than
    `threads` (a web server's workers × threads) keep, or that refuses a new one now, why. Each
    thread keeps one connection per database it uses (DB_CONN_MAX_AGE), so a server holding
    several of them (the shards) is asked for as many times as many; MySQL refuses the ones
    beyond its max_connections (1040) or the user's max_user_connections (1203), and the
    requests that needed them answer 503. A server that does not answer now says nothing."""
    from django.db import connections

    servers: dict[tuple[Any, ...], list[str]] = {}
    params: dict[tuple[Any, ...], dict[str, Any]] = {}
    for alias in settings.DATABASES:
        if connections[alias].vendor != "mysql":
            continue
        given = connections[alias].get_connection_params()
        given.pop("database", None)  # the server's room, whichever database (maybe not made yet)
        where: tuple[Any, ...] = (
            given.get("host"),
            given.get("port") or 3306,
            given.get("unix_socket"),
        )
        servers.setdefault(where, []).append(alias)
        params.setdefault(where, given)
    if not servers:
        return []
    import MySQLdb  # the driver of every MySQL database here (settings.DATABASES)

    short = []
    for where, aliases in servers.items():
        place = f"MySQL at {where[2] or f'{where[0]}:{where[1]}'} ({', '.join(aliases)})"
        wanted = threads * len(aliases)
        more = "raise max_connections above every web thread, Celery's workers and the rest"
        more_of_user = "raise the user's max_user_connections"
        bounded = {"connect_timeout": 3, "read_timeout": 3, "write_timeout": 3}
        try:
            probe = MySQLdb.connect(**{**params[where], **bounded})
        except MySQLdb.Error as exc:
            code = dberrors.code(exc)
            if code in dberrors.REFUSED:
                fix = more_of_user if code == dberrors.USER_LIMIT else more
                short.append(f"{place} refuses new connections now ({exc}): {fix}")
            continue
        try:
            cursor = probe.cursor()
            limit, connected = mysql_room(cursor)
            room = limit - (connected - 1)  # the probe's own connection is gone
            if wanted > room:
                short.append(
                    f"{place} has room for {room} more connections (max_connections {limit},"
                    f" {connected - 1} held) and this server's threads keep up to {wanted}:"
                    f" {more}"
                )
            cursor.execute(
                "SELECT @@max_user_connections, COUNT(*) FROM information_schema.PROCESSLIST"
                " WHERE USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)"
            )
            user_limit, user_connected = (int(value) for value in cursor.fetchone())
            user_room = user_limit - (user_connected - 1)
            if user_limit > 0 and wanted > user_room:
                short.append(
                    f"{place} lets this user open {user_room} more connections"
                    f" (max_user_connections {user_limit}) and this server's threads keep up"
                    f" to {wanted}: {more_of_user}"
                )
        except MySQLdb.Error:
            pass  # what was found before stands
        finally:
            probe.close()
    return short


def register() -> None:
    checks.register(check_celery_broker_apart)


if __name__ == "__main__":  # gunicorn.conf.py's check at start, in a process of its own
    import os
    import sys

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")  # as redpack/wsgi.py
    try:
        django.setup()
        found = mysql_short_of(int(sys.argv[1]))
    except Exception:  # noqa: BLE001 - a check that cannot be made says nothing
        found = []
    for line in found:
        print(line)
