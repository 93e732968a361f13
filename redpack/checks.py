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
    import MySQLdb  # the driver of every MySQL database here (settings.DATABASES)
    from django.db import connections

    servers: dict[tuple[object, ...], list[str]] = {}
    params: dict[tuple[object, ...], dict[str, Any]] = {}
    for alias in settings.DATABASES:
        if connections[alias].vendor != "mysql":
            continue
        given = connections[alias].get_connection_params()
        given.pop("database", None)  # the server's room, whichever database (maybe not made yet)
        where = tuple(given.get(key) for key in ("host", "port", "unix_socket", "user"))
        servers.setdefault(where, []).append(alias)
        params[where] = given
    short = []
    for where, aliases in servers.items():
        place = f"MySQL at {where[2] or f'{where[0]}:{where[1]}'} ({', '.join(aliases)})"
        wanted = threads * len(aliases)
        fix = "raise max_connections above every web thread, Celery's workers and the rest"
        bounded = {"connect_timeout": 3, "read_timeout": 3, "write_timeout": 3}
        try:
            probe = MySQLdb.connect(**{**params[where], **bounded})
        except MySQLdb.Error as exc:
            if dberrors.code(exc) in dberrors.REFUSED:
                short.append(f"{place} refuses new connections now ({exc}): {fix}")
            continue
        try:
            cursor = probe.cursor()
            limit, connected = mysql_room(cursor)
            cursor.execute(
                "SELECT @@max_user_connections, COUNT(*) FROM information_schema.PROCESSLIST"
                " WHERE USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)"
            )
            user_limit, user_connected = cursor.fetchone()
        except MySQLdb.Error:
            continue
        finally:
            probe.close()
        room = limit - (connected - 1)  # the probe's own connection is gone
        if wanted > room:
            short.append(
                f"{place} has room for {room} more connections (max_connections {limit},"
                f" {connected - 1} held) and this server's threads keep up to {wanted}: {fix}"
            )
        user_room = int(user_limit) - (int(user_connected) - 1)
        if int(user_limit) and wanted > user_room:
            short.append(
                f"{place} lets this user open {user_room} more connections"
                f" (max_user_connections {user_limit}) and this server's threads keep up to"
                f" {wanted}: raise the user's max_user_connections"
            )
    return short


def register() -> None:
    checks.register(check_celery_broker_apart)


if __name__ == "__main__":  # gunicorn.conf.py's check at start, in a process of its own
    import os
    import sys

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")  # as redpack/wsgi.py
    django.setup()
    for line in mysql_short_of(int(sys.argv[1])):
        print(line)
