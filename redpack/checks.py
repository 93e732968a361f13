"""System checks of the deployment's shape that settings alone cannot enforce."""

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


def register() -> None:
    checks.register(check_celery_broker_apart)
