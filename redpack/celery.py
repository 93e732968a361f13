import logging
import os
from typing import Any

from celery import Celery, signals

from redpack import logs

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")

app = Celery("redpack")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger("redpack.tasks")


@signals.worker_init.connect
def yield_cpu_to_requests(**kwargs: Any) -> None:
    """The worker's background runs (persisting, crediting, expiry) take the CPU after the web
    processes on a shared host: a burst is answered from Redis first and written to MySQL as
    the CPU frees up (REDPACK_WORKER_NICE; docs/operations.md). Its pool's processes, forked
    after this, inherit it."""
    from django.conf import settings

    if settings.REDPACK_WORKER_NICE:
        os.nice(settings.REDPACK_WORKER_NICE)


@signals.worker_init.connect
def bound_mysql_waits(**kwargs: Any) -> None:
    """The worker's MySQL connections, made after this (its pool's processes fork after it),
    give up on a reply after REDPACK_WORKER_DB_READ_TIMEOUT seconds, where a MySQL that stalled
    without closing held a task until TCP gave up (hours). A DB_READ_TIMEOUT of the
    environment is already in the connections' options and stays."""
    from django.conf import settings
    from django.db import connections

    waits = settings.REDPACK_WORKER_DB_READ_TIMEOUT
    if not waits:
        return
    for alias in connections:
        if connections[alias].vendor == "mysql":
            options = connections[alias].settings_dict["OPTIONS"]
            options.setdefault("read_timeout", waits)
            options.setdefault("write_timeout", waits)


@signals.task_failure.connect
def log_task_failure(sender: Any = None, task_id: str | None = None, **kwargs: Any) -> None:
    """One structured line per task that failed for good (after its retries)."""
    logger.error(
        "task failed",
        extra={
            "event": "task_failed",
            "task": getattr(sender, "name", None),
            "task_id": task_id,
            "error": repr(kwargs.get("exception")),
        },
    )


@signals.before_task_publish.connect
def carry_request_id(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """A task enqueued while a request (or a task) has an id carries it in its headers."""
    current = logs.request_id.get()
    if current is not None and headers is not None:
        headers.setdefault("request_id", current)


@signals.task_prerun.connect
def adopt_request_id(task: Any = None, **kwargs: Any) -> None:
    """The worker's lines while it runs the task carry the id of the request that enqueued it."""
    logs.request_id.set(getattr(task.request, "request_id", None) if task else None)


@signals.task_postrun.connect
def drop_request_id(**kwargs: Any) -> None:
    logs.request_id.set(None)
