import logging
import os
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")

app = Celery("redpack")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger("redpack.tasks")


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
