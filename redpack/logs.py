"""One log line per event: JSON objects for machines (LOG_FORMAT=json), key=value for people.

An event is a log call with `extra={"event": <name>, ...ids}`; the extra keys become fields.
The names in use, so that a log search can rely on them:

- `activity_sent`   activity, strategy, count
- `grab_contended`  activity, user: the attempt got nothing although packets may remain
- `lock_timeout`    activity, user, error: a lock wait gave up; answered as `contended`
- `grab_failed`     activity, user: a grab raised something unexpected (with the traceback)
- `refund`          activity, amount_cents, count: the one refund of an activity
- `persist_failed`  activity, error: an acknowledged grab could not be written to the database
                    yet (async strategies log it; the grab is retried, not lost)
- `task_failed`     task, task_id, error: a Celery task raised
"""

import json
import logging
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra`.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS}


class JsonFormatter(logging.Formatter):
    """{"ts": ..., "level": ..., "logger": ..., "message": ..., "event": ..., <extra>...}."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(extra_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """`<time> <LEVEL> <logger> <message> key=value ...`, a traceback folded into the line."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [self.formatTime(record), record.levelname, record.name, record.getMessage()]
        parts += [f"{k}={v}" for k, v in extra_fields(record).items()]
        if record.exc_info:
            parts.append(self.formatException(record.exc_info))
        return " ".join(parts).replace("\n", "\\n")
