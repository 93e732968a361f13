"""System checks of the deployment's shape that settings alone cannot enforce."""

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks


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
    """For each MySQL server of the settings that answers and has room for fewer connections
    than `threads` (a web server's workers × threads) keep, why. Each thread keeps one
    connection per database it uses (DB_CONN_MAX_AGE), so a server holding several of them (the
    shards) is asked for as many times as many; MySQL refuses the ones beyond its
    max_connections (1040), and the requests that needed them answer 503. A server that does
    not answer now says nothing."""
    import MySQLdb  # the driver of every MySQL database here (settings.DATABASES)

    servers: dict[tuple[str, int, str], list[str]] = {}
    for alias, db in settings.DATABASES.items():
        if db["ENGINE"] == "django.db.backends.mysql":
            where = (db["HOST"] or "localhost", int(db["PORT"] or 3306), db["USER"])
            servers.setdefault(where, []).append(alias)
    short = []
    for (host, port, user), aliases in servers.items():
        db = settings.DATABASES[aliases[0]]
        try:
            probe = MySQLdb.connect(
                host=host, port=port, user=user, password=db["PASSWORD"], connect_timeout=3
            )
        except MySQLdb.Error:
            continue
        try:
            limit, connected = mysql_room(probe.cursor())
        finally:
            probe.close()
        room = limit - (connected - 1)  # the probe's own connection is gone
        wanted = threads * len(aliases)
        if wanted > room:
            short.append(
                f"MySQL at {host}:{port} ({', '.join(aliases)}) has room for {room} more"
                f" connections (max_connections {limit}, {connected - 1} held) and this"
                f" server's threads keep up to {wanted}: raise max_connections above every"
                " web thread, Celery's workers and the rest"
            )
    return short


def register() -> None:
    checks.register(check_celery_broker_apart)
