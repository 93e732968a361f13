"""One settings module, driven by the environment (12-factor).

Every value can be set by an environment variable or a `.env` file in the repository root
(`make run` writes one with a fresh SECRET_KEY the first time).
"""

import ipaddress
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.retry import Retry

import strategies

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY is not set: export it or put it in .env (`make run` writes one)."
    )
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# Behind HTTPS (a TLS-terminating proxy that sets X-Forwarded-Proto): secure cookies, HSTS,
# redirect plain HTTP. Off by default so `make run` works on http://127.0.0.1.
HTTPS = env.bool("HTTPS", default=False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# Request bodies above this size are refused with 413 before they are read.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("MAX_REQUEST_BYTES", default=64 * 1024)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework_simplejwt",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "redpack.apps.RedpackConfig",
]

MIDDLEWARE = [
    "redpack.api.middleware.AnswerFramingMiddleware",  # sees every answer last
    "redpack.api.middleware.RequestIdMiddleware",  # every log line of a request has its id
    "redpack.api.middleware.RequestTargetMiddleware",  # `*`, an authority, an absolute URL
    "django.middleware.security.SecurityMiddleware",
    "redpack.api.middleware.RequestSizeLimitMiddleware",
    "redpack.api.middleware.CredentialThrottleMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Session, auth and messages: for the browser (admin, API docs), not for the token-only hot
    # endpoints (grab, ping: redpack/api/middleware.py TOKEN_ONLY_PATHS). CSRF stays whole, as
    # Django's deploy checks know it; for those DRF views (csrf_exempt) it returns at once.
    "redpack.api.middleware.BrowserSessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "redpack.api.middleware.BrowserAuthenticationMiddleware",
    "redpack.api.middleware.BrowserMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "redpack.urls"
WSGI_APPLICATION = "redpack.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "redpack.context_processors.run_mode",
            ],
        },
    },
]

# MySQL/MariaDB: utf8mb4 and READ COMMITTED, as Django's database notes recommend.
DATABASES = {
    "default": env.db_url("DATABASE_URL", default="mysql://root:@127.0.0.1:3306/redpack"),
}
# Activities sharded by id (redpack/shards.py, docs/operations.md "Scaling out"): empty (the
# default), all on `default`; else `alias=db_url` pairs, comma-separated, e.g.
# `shard0=mysql://…/redpack_s0,shard1=mysql://…/redpack_s1`. Activity id N lives on the
# (N mod count)-th in this order, so the order is fixed for good. Users and money stay on default.
REDPACK_SHARDS: tuple[str, ...] = ()
for _pair in env.list("REDPACK_SHARDS", default=[]):
    _alias, _, _url = _pair.partition("=")
    if not _url or _alias.strip() in DATABASES:
        raise ImproperlyConfigured(f"REDPACK_SHARDS: {_pair!r} is not a new `alias=db_url` pair")
    DATABASES[_alias.strip()] = env.db_url_config(_url.strip())
    REDPACK_SHARDS += (_alias.strip(),)
DATABASE_ROUTERS = ["redpack.shards.ShardRouter"] if REDPACK_SHARDS else []


WEB_PROCESS = env.bool("REDPACK_WEB_PROCESS", default=False)  # redpack/wsgi.py's app


def _configure_database(db: dict) -> None:  # type: ignore[type-arg]
    if db["ENGINE"] == "django.db.backends.mysql":
        db.setdefault("OPTIONS", {}).update(
            {
                "charset": "utf8mb4",
                "isolation_level": "read committed",
                "init_command": "SET sql_mode='STRICT_TRANS_TABLES'",
                # Bounded handshake: a connect lost in a full listen backlog fails, not hangs.
                "connect_timeout": env.int("DB_CONNECT_TIMEOUT", default=10),
            }
        )
        # Seconds a statement's reply may take before the client gives up on its connection
        # (lost, the outcome unknown: a grab settles it or answers 503), so that a MySQL that
        # stalls without closing does not hold a thread until TCP gives up; 0: no limit. 90 in
        # the web process (REDPACK_WEB_PROCESS, set by redpack/wsgi.py): longer than InnoDB's
        # lock wait (50 s), which a grab may rightly spend on a row. In a Celery worker,
        # REDPACK_WORKER_DB_READ_TIMEOUT (below). None elsewhere unless set: a migration's DDL
        # may rightly run long.
        waits = env.int("DB_READ_TIMEOUT", default=90 if WEB_PROCESS else 0)
        if waits < 0:
            raise ImproperlyConfigured(f"DB_READ_TIMEOUT must be 0 (none) or more, not {waits}")
        if waits:
            db["OPTIONS"].update(read_timeout=waits, write_timeout=waits)
        db.setdefault("TEST", {}).update({"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"})
    # SQLite: the embedded fallback of `make run` (redpack/launch.py), never a benchmark. Every
    # transaction begins IMMEDIATE, taking the write lock up front: SQLite ignores SELECT … FOR
    # UPDATE, so this is what keeps the row-locking strategies exact (writers run one at a time),
    # and waiting writers queue for up to `timeout` seconds (the busy timeout), not fail at once.
    if db["ENGINE"] == "django.db.backends.sqlite3":
        db.setdefault("OPTIONS", {}).update(
            {
                "transaction_mode": "IMMEDIATE",
                "timeout": env.float("SQLITE_BUSY_TIMEOUT", default=20.0),
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            }
        )
    db["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
    db["CONN_HEALTH_CHECKS"] = True


# A Celery worker's DB_READ_TIMEOUT unless set (redpack/celery.py applies it as the worker
# starts): a task stuck on a MySQL that stalled gives up after 5 minutes, and its next run takes
# over; longer than any task's statement rightly takes, a lock wait (50 s) among them.
REDPACK_WORKER_DB_READ_TIMEOUT = env.int("DB_READ_TIMEOUT", default=300)


def configure_shard(db: dict, number: int, count: int) -> None:  # type: ignore[type-arg]
    """A shard's rows (grab rows, refund records, packets, persist failures) take ids that no
    other shard takes: shard k of n counts k+1, k+1+n, … (auto_increment_offset, _increment),
    so the ledger on default can key its entries by them. Activity ids come from default."""
    if db["ENGINE"] != "django.db.backends.mysql":
        raise ImproperlyConfigured(f"REDPACK_SHARDS: a shard runs on MySQL, not {db['ENGINE']}")
    db["OPTIONS"]["init_command"] += (
        f", auto_increment_increment={count}, auto_increment_offset={number + 1}"
    )


for _db in DATABASES.values():
    _configure_database(_db)
for _number, _alias in enumerate(REDPACK_SHARDS):
    configure_shard(DATABASES[_alias], _number, len(REDPACK_SHARDS))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis holds locks, queues and hot packet state: it must run with maxmemory-policy noeviction.
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
# Seconds to connect, and to wait for one reply, for the single Redis and the Redis Cluster alike.
REDIS_CONNECT_TIMEOUT = env.float("REDIS_CONNECT_TIMEOUT", default=2.0)
REDIS_SOCKET_TIMEOUT = env.float("REDIS_SOCKET_TIMEOUT", default=5.0)
# The clients re-send nothing by themselves (redis-py 6 would re-send any command, a grab script
# included, up to 3 times on a dropped connection): a lost reply is settled where it can be
# (strategies/redis_state/keys.py re-runs a grab script under the same attempt token).
REDIS_RETRY = Retry(NoBackoff(), 0)
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.DefaultClient",
            "CONNECTION_POOL_KWARGS": {
                "max_connections": env.int("REDIS_MAX_CONNECTIONS", 500),
                "retry": REDIS_RETRY,
            },
            "SOCKET_CONNECT_TIMEOUT": REDIS_CONNECT_TIMEOUT,
            "SOCKET_TIMEOUT": REDIS_SOCKET_TIMEOUT,
        },
    }
}

# Celery: the broker lives in another Redis database than the packet state. Every task is
# idempotent (redpack/tasks.py), so it is acknowledged only once it ran (acks_late) and a
# worker takes one message at a time. JSON only. Exactly one beat runs (docker-compose.yml).
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/1")
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Worker logs go through LOGGING below (structured), not Celery's own format.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Task events (sent, received, started, succeeded, failed) for Flower and `celery events`.
CELERY_WORKER_SEND_TASK_EVENTS = env.bool("CELERY_TASK_EVENTS", default=True)
CELERY_TASK_SEND_SENT_EVENT = env.bool("CELERY_TASK_EVENTS", default=True)
# The worker heartbeat travels beat -> broker -> worker -> Redis; /healthz reads its age.
REDPACK_HEARTBEAT_SECONDS = env.float("REDPACK_HEARTBEAT_SECONDS", default=5.0)
# redis_queue_async's persister (strategies/redis_queue_async/persister.py): how often beat
# starts a persist run, how long one run may go on, grabs per MySQL transaction, after how long
# a grab delivered to a consumer that never acknowledged it is taken over, after how many
# failures of its own a grab goes to the dead letters, and how long a grab may wait in Redis
# while grabs pour in (persister.surging; 0: the persister never waits for a surge's end).
REDPACK_PERSIST_INTERVAL = env.float("REDPACK_PERSIST_INTERVAL", default=0.5)
REDPACK_PERSIST_RUN_SECONDS = env.float("REDPACK_PERSIST_RUN_SECONDS", default=20.0)
REDPACK_PERSIST_BATCH = env.int("REDPACK_PERSIST_BATCH", default=500)
REDPACK_PERSIST_RECLAIM_SECONDS = env.float("REDPACK_PERSIST_RECLAIM_SECONDS", default=30.0)
REDPACK_PERSIST_RECLAIM_INTERVAL = env.float("REDPACK_PERSIST_RECLAIM_INTERVAL", default=5.0)
REDPACK_PERSIST_MAX_ATTEMPTS = env.int("REDPACK_PERSIST_MAX_ATTEMPTS", default=5)
REDPACK_PERSIST_SURGE_LAG = env.float("REDPACK_PERSIST_SURGE_LAG", default=5.0)
# How much the Celery worker yields the CPU to the web processes on a shared host: its
# niceness, added at start (0: none). docs/operations.md gives the measurement behind it.
REDPACK_WORKER_NICE = env.int("REDPACK_WORKER_NICE", default=10)
if not 0 <= REDPACK_WORKER_NICE <= 19:
    raise ImproperlyConfigured(f"REDPACK_WORKER_NICE must be 0 to 19, not {REDPACK_WORKER_NICE}")
# Crediting grabs (redpack/ledger.py: grabs_credit): how often beat starts a run (seconds), grab
# rows per MySQL transaction, and how long one run may go on (seconds).
REDPACK_CREDIT_INTERVAL = env.float("REDPACK_CREDIT_INTERVAL", default=1.0)
REDPACK_CREDIT_BATCH = env.int("REDPACK_CREDIT_BATCH", default=500)
REDPACK_CREDIT_RUN_SECONDS = env.float("REDPACK_CREDIT_RUN_SECONDS", default=5.0)
# Crediting yields to a burst (redpack/credit_pace.py): while grab rows are written at this many
# per second or faster (0: never yields), it waits, for at most REDPACK_CREDIT_MAX_WAIT seconds.
REDPACK_CREDIT_YIELD_RATE = env.float("REDPACK_CREDIT_YIELD_RATE", default=500.0)
REDPACK_CREDIT_MAX_WAIT = env.float("REDPACK_CREDIT_MAX_WAIT", default=30.0)
# Deactivated and deleted users (redpack/bans.py): seconds a web process trusts its last answer
# for a user, and between two full re-reads of the set from MySQL.
REDPACK_BANS_LOCAL_SECONDS = env.float("REDPACK_BANS_LOCAL_SECONDS", default=2.0)
REDPACK_BANS_SYNC_SECONDS = env.float("REDPACK_BANS_SYNC_SECONDS", default=60.0)
CELERY_BEAT_SCHEDULE = {
    "expire-due-activities": {"task": "redpack.tasks.expire_due", "schedule": 1.0},
    "sweep-overdue-activities": {"task": "redpack.tasks.sweep_overdue", "schedule": 60.0},
    "sync-disabled-users": {
        "task": "redpack.tasks.sync_disabled_users",
        "schedule": REDPACK_BANS_SYNC_SECONDS,
        "options": {"expires": REDPACK_BANS_SYNC_SECONDS},
    },
    "worker-heartbeat": {
        "task": "redpack.tasks.heartbeat",
        "schedule": REDPACK_HEARTBEAT_SECONDS,
        "options": {"expires": REDPACK_HEARTBEAT_SECONDS},
    },
    # A run that has not started within a few intervals is dropped: the next one does its work.
    "persist-grabs": {
        "task": "redpack.tasks.persist_grabs",
        "schedule": REDPACK_PERSIST_INTERVAL,
        "options": {"expires": 10 * REDPACK_PERSIST_INTERVAL},
    },
    "credit-grabs": {
        "task": "redpack.tasks.credit_grabs",
        "schedule": REDPACK_CREDIT_INTERVAL,
        "options": {"expires": 10 * REDPACK_CREDIT_INTERVAL},
    },
    "reclaim-grabs": {
        "task": "redpack.tasks.reclaim_grabs",
        "schedule": REDPACK_PERSIST_RECLAIM_INTERVAL,
        "options": {"expires": 10 * REDPACK_PERSIST_RECLAIM_INTERVAL},
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "redpack.api.auth.UserJWTAuthentication",
        "redpack.api.auth.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "redpack.api.schema.RedpackAutoSchema",
    "EXCEPTION_HANDLER": "redpack.api.errors.exception_handler",
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "redpack.api.negotiation.Negotiation",
    "DEFAULT_PARSER_CLASSES": [
        "redpack.api.parsers.StrictJSONParser",
        "redpack.api.parsers.StrictFormParser",
        "redpack.api.parsers.StrictMultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "redpack.api.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": None,
}

SIMPLE_JWT = {
    "ACCESS_TOKEN_LIFETIME": timedelta(seconds=env.int("JWT_ACCESS_SECONDS", default=3600)),
    "REFRESH_TOKEN_LIFETIME": timedelta(days=env.int("JWT_REFRESH_DAYS", default=1)),
    "AUTH_HEADER_TYPES": ("Bearer",),
    "SIGNING_KEY": SECRET_KEY,
    # A signed claim that names no time is a 401, not a 500 (redpack/api/auth.py).
    "AUTH_TOKEN_CLASSES": ("redpack.api.auth.CheckedAccessToken",),
    # A deleted user's refresh token is refused (401), not a 500 (redpack/api/auth.py).
    "TOKEN_REFRESH_SERIALIZER": "redpack.api.auth.RefreshSerializer",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "redpack API",
    "DESCRIPTION": "Send and grab red packets (红包) with a pluggable concurrency strategy.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI's files from drf-spectacular-sidecar (static files), not a CDN: works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "PREPROCESSING_HOOKS": ["redpack.api.schema.slash_paths_only"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "redpack.api.schema.no_null_characters",
    ],
}

# Grab strategies: name -> dotted path (strategies.BUILTIN: every strategy this project ships).
# An unknown or unimportable entry fails `manage.py check`.
REDPACK_STRATEGIES = dict(strategies.BUILTIN)
# Strategies marked unsafe (they oversell under contention) are refused unless this is on.
REDPACK_ALLOW_UNSAFE_STRATEGIES = env.bool("REDPACK_ALLOW_UNSAFE_STRATEGIES", default=False)
# distributed_lock: the Redis lock's lifetime (seconds; far above one grab, which takes
# milliseconds, so only a paused process outlives it) and how long a grab waits for it before
# answering `contended`.
REDPACK_LOCK_TIMEOUT = env.float("REDPACK_LOCK_TIMEOUT", default=5.0)
REDPACK_LOCK_WAIT = env.float("REDPACK_LOCK_WAIT", default=3.0)
# optimistic / preallocated: retries after a lost race before answering `contended`, each after
# a jittered sleep of up to REDPACK_RETRY_BACKOFF × 2^retry seconds.
REDPACK_OPTIMISTIC_MAX_RETRIES = env.int("REDPACK_OPTIMISTIC_MAX_RETRIES", default=3)
REDPACK_PREALLOCATED_MAX_RETRIES = env.int("REDPACK_PREALLOCATED_MAX_RETRIES", default=5)
REDPACK_RETRY_BACKOFF = env.float("REDPACK_RETRY_BACKOFF", default=0.005)
REDPACK_MAX_COUNT = env.int("REDPACK_MAX_COUNT", default=10_000)
REDPACK_MAX_TOTAL_AMOUNT = env.str("REDPACK_MAX_TOTAL_AMOUNT", default="1000000.00")
# The average packet may not exceed this (double-average draws stay below twice the average).
REDPACK_MAX_PACKET_AMOUNT = env.str("REDPACK_MAX_PACKET_AMOUNT", default="200.00")
# Per-user rates ("count/period": s, min, hour, day), counted atomically in Redis and per
# process while Redis is away (redpack/ratelimit.py); empty means unthrottled.
REDPACK_THROTTLE_RATES = {
    "grab": env.str("REDPACK_GRAB_RATE", default="120/min") or None,
    "send": env.str("REDPACK_SEND_RATE", default="30/min") or None,
}
# A grab of a Redis strategy makes its request's ban and throttle checks in the grab script's
# own run instead of a round trip before it (redpack/api/gate.py); off: the round trip before.
REDPACK_GRAB_CHECKS_IN_SCRIPT = env.bool("REDPACK_GRAB_CHECKS_IN_SCRIPT", default=True)
# Login attempts (token, token refresh, admin login) per client IP and per username; 429 beyond.
REDPACK_LOGIN_RATES = {
    "ip": env.str("REDPACK_LOGIN_IP_RATE", default="30/min") or None,
    "username": env.str("REDPACK_LOGIN_USERNAME_RATE", default="10/min") or None,
}
# Expiry: due activities are claimed in batches and leased while their refund runs.
REDPACK_EXPIRY_BATCH = env.int("REDPACK_EXPIRY_BATCH", default=100)
REDPACK_EXPIRY_LEASE_SECONDS = env.float("REDPACK_EXPIRY_LEASE_SECONDS", default=60.0)
# A refund that cannot settle yet is tried again after this many seconds, doubling each time up
# to the maximum (redpack/expiry.py: postpone).
REDPACK_REFUND_RETRY_SECONDS = env.float("REDPACK_REFUND_RETRY_SECONDS", default=5.0)
REDPACK_REFUND_RETRY_MAX_SECONDS = env.float("REDPACK_REFUND_RETRY_MAX_SECONDS", default=600.0)
REDPACK_SETTLE_TIMEOUT = env.float("REDPACK_SETTLE_TIMEOUT", default=10.0)
REDPACK_MIN_EXPIRES_IN = env.int("REDPACK_MIN_EXPIRES_IN", default=1)
REDPACK_MAX_EXPIRES_IN = env.int("REDPACK_MAX_EXPIRES_IN", default=7 * 24 * 3600)
# Money (redpack/ledger.py), decimal strings: what bench users, the bench sender, the demo users
# and the demo admin are topped up to when they are created or reused (default: the largest
# total one activity may hold, so any one send succeeds; 0 turns it off), and the most one
# deposit may add.
REDPACK_STARTING_BALANCE = env.str("REDPACK_STARTING_BALANCE", default=REDPACK_MAX_TOTAL_AMOUNT)
REDPACK_MAX_DEPOSIT = env.str("REDPACK_MAX_DEPOSIT", default="1000000000.00")
# The Redis strategies keep their state in REDIS_URL, or in this Redis Cluster when set
# (redis://host:port of any node; keys of one activity share a hash tag, so one slot).
REDPACK_REDIS_CLUSTER_URL = env.str("REDPACK_REDIS_CLUSTER_URL", default="")
# Their keys expire this many seconds after the activity does (or after it closes).
REDPACK_REDIS_STATE_GRACE = env.int("REDPACK_REDIS_STATE_GRACE", default=3600)
# Times a grab script is sent again, under the same attempt, after its reply was lost (count).
REDPACK_REDIS_GRAB_RERUNS = env.int("REDPACK_REDIS_GRAB_RERUNS", default=2)
# Batched strategies (strategies/combiner.py): the most grabs of one activity one batch takes
# (one Redis script run, one MySQL transaction). Batches form only under contention.
REDPACK_BATCH_MAX = env.int("REDPACK_BATCH_MAX", default=64)
# A caller handed a batch's lead lets running threads join the line first: it gives up the
# interpreter once, then again while the line grew since, at most this many times (0: never).
# Measured in docs/benchmarks.md.
REDPACK_BATCH_GATHER = env.int("REDPACK_BATCH_GATHER", default=4)
# Fast answers (redpack/finished.py): seconds a process, and Redis for the others, remembers
# that an activity is sold out or closed; holders kept per activity at most for the answers.
REDPACK_FINISHED_SECONDS = env.float("REDPACK_FINISHED_SECONDS", default=2.0)
REDPACK_FINISHED_MAX_HOLDERS = env.int("REDPACK_FINISHED_MAX_HOLDERS", default=20_000)
# Load shedding (redpack/shedding.py): grabs of one activity under way in one process at most;
# one more is answered 409 contended (reason shed) with Retry-After.
REDPACK_GRAB_LINE = env.int("REDPACK_GRAB_LINE", default=2 * REDPACK_BATCH_MAX)
# `optimistic`'s line: one grab of an activity tries at a time per web process (docs/benchmarks.md).
REDPACK_OPTIMISTIC_LINE = env.int("REDPACK_OPTIMISTIC_LINE", default=1)
REDPACK_SHED_RETRY_AFTER = env.int("REDPACK_SHED_RETRY_AFTER", default=1)
# Written by `make run` (redpack/launch.py) into .run/run.env: the Locust UI's URL, linked from
# the landing page (empty: no link), and what runs embedded (SQLite, embedded Redis), shown as a
# ribbon on every page (empty: nothing embedded).
REDPACK_LOCUST_URL = env.str("REDPACK_LOCUST_URL", default="")
REDPACK_EMBEDDED = env.str("REDPACK_EMBEDDED", default="")

# GET /metrics (redpack/exposition.py): loopback addresses may read it, so may these networks
# (comma-separated CIDRs, default none) and anyone sending `Authorization: Bearer <token>`
# with this token (default empty: no token accepted).
REDPACK_METRICS_TOKEN = env.str("REDPACK_METRICS_TOKEN", default="")
REDPACK_METRICS_NETWORKS = env.list("REDPACK_METRICS_NETWORKS", default=[])
try:
    for _network in REDPACK_METRICS_NETWORKS:
        ipaddress.ip_network(_network, strict=False)
except ValueError as exc:
    raise ImproperlyConfigured(f"REDPACK_METRICS_NETWORKS: {exc}") from exc

# Errors to Sentry (sentry-sdk, a core dependency) from the web, worker and beat processes, only
# when SENTRY_DSN is set; no personal data is sent, and no performance traces unless
# SENTRY_TRACES_SAMPLE_RATE (a share, 0 to 1) asks for them.
SENTRY_DSN = env.str("SENTRY_DSN", default="")
if SENTRY_DSN:
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration
    from sentry_sdk.integrations.django import DjangoIntegration

    sentry_sdk.init(
        dsn=SENTRY_DSN,
        environment=env.str("SENTRY_ENVIRONMENT", default="production"),
        integrations=[DjangoIntegration(), CeleryIntegration()],
        traces_sample_rate=env.float("SENTRY_TRACES_SAMPLE_RATE", default=0.0),
        send_default_pii=False,
    )

# One line per event: JSON objects in production (the default unless DEBUG), `plain` for people.
# Events carry `extra={"event": ...}` and their ids; see redpack/logs.py for the names.
LOG_FORMAT = env.str("LOG_FORMAT", default="plain" if DEBUG else "json")
if LOG_FORMAT not in ("json", "plain"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be json or plain, not {LOG_FORMAT!r}")
# redis_queue_async's grabs that failed to persist (event persist_failed) also go, as JSON lines,
# to this file of their own when set (seed 001's redpack.persist.log).
PERSIST_FAILURE_LOG = env.str("PERSIST_FAILURE_LOG", default="")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "redpack.logs.JsonFormatter"},
        "plain": {"()": "redpack.logs.PlainFormatter"},
    },
    "filters": {
        "one_line_per_refusal": {"()": "redpack.logs.OneLinePerRefusal"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT},
        **(
            {
                "persist_failures": {
                    "class": "logging.handlers.WatchedFileHandler",
                    "filename": PERSIST_FAILURE_LOG,
                    "formatter": "json",
                }
            }
            if PERSIST_FAILURE_LOG
            else {}
        ),
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    # Celery logs every task received, finished and sent by beat at INFO: with expiry every
    # second that buries the events above. CELERY_TASK_LOG_LEVEL=INFO brings those lines back.
    "loggers": {
        **{
            name: {"level": env.str("CELERY_TASK_LOG_LEVEL", default="WARNING")}
            for name in ("celery.app.trace", "celery.worker.strategy", "celery.beat")
        },
        "django.request": {"filters": ["one_line_per_refusal"]},
        "redpack.persist.failures": {
            "handlers": ["persist_failures"] if PERSIST_FAILURE_LOG else [],
        },
    },
}
