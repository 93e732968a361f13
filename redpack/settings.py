"""One settings module, driven by the environment (12-factor).

Every value can be set by an environment variable or a `.env` file in the repository root
(`make run` writes one with a fresh SECRET_KEY the first time).
"""

from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

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
    "redpack.apps.RedpackConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
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
            ],
        },
    },
]

# MySQL/MariaDB: utf8mb4 and READ COMMITTED, as Django's database notes recommend.
DATABASES = {
    "default": env.db_url("DATABASE_URL", default="mysql://root:@127.0.0.1:3306/redpack"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "charset": "utf8mb4",
            "isolation_level": "read committed",
            "init_command": "SET sql_mode='STRICT_TRANS_TABLES'",
        }
    )
    DATABASES["default"].setdefault("TEST", {}).update(
        {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
    )
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis holds locks, queues and hot packet state: it must run with maxmemory-policy noeviction.
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.DefaultClient",
            "CONNECTION_POOL_KWARGS": {"max_connections": env.int("REDIS_MAX_CONNECTIONS", 500)},
            "SOCKET_CONNECT_TIMEOUT": 2,
            "SOCKET_TIMEOUT": 5,
        },
    }
}

# Celery: the broker lives in another Redis database than the packet state.
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
        "rest_framework_simplejwt.authentication.JWTAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "redpack.api.errors.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": None,
}

SIMPLE_JWT = {
    "ACCESS_TOKEN_LIFETIME": timedelta(seconds=env.int("JWT_ACCESS_SECONDS", default=3600)),
    "REFRESH_TOKEN_LIFETIME": timedelta(days=env.int("JWT_REFRESH_DAYS", default=1)),
    "AUTH_HEADER_TYPES": ("Bearer",),
    "SIGNING_KEY": SECRET_KEY,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "redpack API",
    "DESCRIPTION": "Send and grab red packets (红包) with a pluggable concurrency strategy.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
}

# Grab strategies: name -> dotted path. An unknown or unimportable entry fails `manage.py check`.
REDPACK_STRATEGIES = {
    "pessimistic": "strategies.pessimistic.PessimisticStrategy",
    "distributed_lock": "strategies.distributed_lock.DistributedLockStrategy",
    "optimistic": "strategies.optimistic.OptimisticStrategy",
    "preallocated": "strategies.preallocated.PreallocatedStrategy",
    "preallocated_skip_locked": "strategies.preallocated_skip_locked.SkipLockedStrategy",
    "unsafe": "strategies.unsafe.UnsafeStrategy",
}
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
REDPACK_MIN_EXPIRES_IN = env.int("REDPACK_MIN_EXPIRES_IN", default=1)
REDPACK_MAX_EXPIRES_IN = env.int("REDPACK_MAX_EXPIRES_IN", default=7 * 24 * 3600)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}
