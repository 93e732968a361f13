"""The Redis client of the Redis strategies and their Lua scripts (strategies/lua/*.lua).

One place decides where packet state lives: the django-redis connection ("default" cache) or,
when REDPACK_REDIS_CLUSTER_URL is set, a Redis Cluster. Each script is registered once per
client and runs with EVALSHA; redis-py's Script loads it again when a server answers NOSCRIPT
(after a restart, a SCRIPT FLUSH, or on a cluster node that has not seen it yet).
"""

from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django_redis import get_redis_connection
from redis import Redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

SCRIPTS = Path(__file__).resolve().parent


@cache
def redis_client() -> Redis | RedisCluster:
    if settings.REDPACK_REDIS_CLUSTER_URL:
        # The same timeouts and retry policy as the single Redis (settings.CACHES).
        return RedisCluster.from_url(
            settings.REDPACK_REDIS_CLUSTER_URL,
            socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
            socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
            retry=settings.REDIS_RETRY,
        )
    return get_redis_connection("default")


@cache
def script(name: str) -> Script:
    """The script strategies/lua/<name>.lua, registered on the current client."""
    client = redis_client()
    # RedisCluster has register_script too; redis-py's annotations only name Redis.
    return client.register_script((SCRIPTS / f"{name}.lua").read_text())  # type: ignore[misc]


@receiver(setting_changed)
def _forget_client(*, setting: str, **kwargs: Any) -> None:
    if setting in {"REDPACK_REDIS_CLUSTER_URL", "CACHES"}:
        redis_client.cache_clear()
        script.cache_clear()
