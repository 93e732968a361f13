"""Test settings: the real MariaDB and Redis, with Redis state in its own database number."""

import os
from copy import deepcopy

os.environ.setdefault("SECRET_KEY", "test-only-secret-key-that-is-long-enough-for-hs256-signing")
os.environ.setdefault("DB_CONN_MAX_AGE", "0")

from redpack.settings import *  # noqa: E402,F403
from redpack.settings import CACHES, DATABASES, configure_shard, env  # noqa: E402

TEST_REDIS_URL = env.str("TEST_REDIS_URL", default="redis://127.0.0.1:6379/15")
CACHES["default"]["LOCATION"] = TEST_REDIS_URL
CELERY_BROKER_URL = env.str("TEST_CELERY_BROKER_URL", default="redis://127.0.0.1:6379/14")
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast test logins
WHITENOISE_AUTOREFRESH = True  # no collectstatic before tests
# Throttling is tested on its own (tests/api/test_hostile.py); elsewhere it would only add noise.
REDPACK_THROTTLE_RATES = {"grab": None, "send": None}
REDPACK_LOGIN_RATES = {"ip": None, "username": None}  # tests/api/test_throttles.py turns them on
REDPACK_REDIS_CLUSTER_URL = ""  # tests/strategies/test_redis_cluster.py starts its own cluster
# Two shard databases beside default, for tests/test_shards.py, which turns sharding on
# (REDPACK_SHARDS, DATABASE_ROUTERS); pytest-django creates them only for a test that names them.
TEST_SHARDS = ("shard0", "shard1")
for _number, _alias in enumerate(TEST_SHARDS):
    DATABASES[_alias] = deepcopy(DATABASES["default"])
    DATABASES[_alias]["NAME"] = f"{DATABASES['default']['NAME']}_s{_number}"
    DATABASES[_alias]["TEST"].pop("NAME", None)
    configure_shard(DATABASES[_alias], _number, len(TEST_SHARDS))
