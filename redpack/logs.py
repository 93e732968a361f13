"""One log line per event: JSON objects for machines (LOG_FORMAT=json), key=value for people.

An event is a log call with `extra={"event": <name>, ...ids}`; the extra keys become fields.
The names in use, so that a log search can rely on them:

- `activity_sent`   activity, strategy, count
- `grab_contended`  activity, user: the attempt got nothing although packets may remain;
                    `reason` shed when the activity's line in this process was full
- `lock_timeout`    activity, user, error: a lock wait gave up; answered as `contended`
- `grab_failed`     activity, user: a grab raised something unexpected (with the traceback)
- `refund`          activity, amount_cents, count: the one refund of an activity
- `persist_failed`  activity, entry, user, mark, attempts, status, error: an acknowledged grab
                    could not be written to the database (strategies/redis_queue_async/
                    persister.py; status `retrying`: it is retried, `dead`: it waits in the
                    admin's Persist failures)
- `task_failed`     task, task_id, error: a Celery task raised
- `credit_short`    activity, grab: a grab row its activity's money cannot cover (an overselling
                    strategy's), left uncredited (redpack/ledger.py)
- `throttled`       scope, window, count, limit: a web process found a rate limit's window over
                    its limit (once per process and window: its further 429s are not logged)

Every line also carries `request_id` while one is known: the web request's (its X-Request-ID
header, or one made up; echoed in the response: redpack/api/middleware.py), carried in the
headers of any Celery task enqueued meanwhile, and so on the lines of the worker that runs it
(redpack/celery.py).
"""

import json
import logging
import re
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from django.http.multipartparser import MultiPartParserError

# The id of the request (or of the task enqueued by one) this thread is working for.
request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
REQUEST_ID_HEADER = "X-Request-ID"
_FOREIGN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # what a caller's id may look like


def request_id_from(header: str | None) -> str:
    """The caller's request id when it looks like one, else a new one."""
    if header and _FOREIGN_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


# Attributes every LogRecord has; anything else on a record came from `extra`.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def carry_request_ids() -> None:
    """From now on every log record made while a request id is known carries it (set when the
    record is made, so a handler that formats later still has it). Called once at start-up."""
    make = logging.getLogRecordFactory()
    if getattr(make, "carries_request_id", False):
        return

    def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        current = request_id.get()
        if current is not None:
            record.request_id = current
        return record

    make_record.carries_request_id = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(make_record)


# Characters of a client's input (a path, a Host, the bytes of a malformed head) that a line of
# Django's request loggers (or of the web server's refusals: redpack/webworker.py) quotes, at
# most: a scanner's 8 KB path or Host made each of its lines that long (a refused Host's twice).
QUOTED_AT_MOST = 200
# Django's loggers whose messages quote a client's request (the path, a refused Host).
_QUOTING_LOGGERS = ("django.request", "django.security", "django.server")


def cut(text: str) -> str:
    """`text`, at most QUOTED_AT_MOST characters (the last an ellipsis when it was longer)."""
    return text if len(text) <= QUOTED_AT_MOST else text[: QUOTED_AT_MOST - 1] + "…"


def message_of(record: logging.LogRecord) -> str:
    """The record's message, cut where a Django logger quotes a client's request in it."""
    message = record.getMessage()
    return cut(message) if record.name.startswith(_QUOTING_LOGGERS) else message


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's own fields; Django's `request` (whose repr quotes the path whole) cut. The
    record keeps its request object, for the handlers that read it (AdminEmailHandler)."""
    fields = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS}
    if "request" in fields:
        fields["request"] = cut(str(fields["request"]))
    return fields


class OneLinePerRefusal(logging.Filter):
    """On django.request, which logs every 4xx answer as a WARNING: a 409 (only a grab answers
    one: `contended`) is logged once already, as the `grab_contended` event (`lock_timeout`
    after a lock wait gave up), and in a hot burst there are thousands of them; its second line
    is dropped. A 429 is said by the `throttled` event, once per process and window
    (redpack/ratelimit.py), not once per request of a client that keeps sending. A body a form
    view (the admin's) could not read as multipart (MultiPartParserError, the client's fault) is
    one line, without the traceback Django adds. Every other answer is logged as Django logs
    it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) in (409, 429):
            return False
        if record.exc_info and isinstance(record.exc_info[1], MultiPartParserError):
            record.exc_info = record.exc_text = None
        return True


class ClientFaultAsWarning(logging.Filter):
    """On the django.security.<kind> loggers of the refusals redpack/api/handlers.py answers
    (CLIENT_REFUSALS: a host this server does not serve, too many fields or files, a body too
    large, a malformed multipart body, an admin lookup or `_to_field` the admin does not allow),
    which Django logs at ERROR with a traceback: each is the client's fault, answered 400 like
    any other bad request, and a scanner sends thousands. One WARNING line each, as
    django.request logs other 4xx answers, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


def demote_client_refusals() -> None:
    """ClientFaultAsWarning on the logger of each of handlers.CLIENT_REFUSALS. Called once at
    start-up; again, it adds nothing."""
    from redpack.api.handlers import CLIENT_REFUSALS

    for kind in CLIENT_REFUSALS:
        logger = logging.getLogger(f"django.security.{kind.__name__}")
        if not any(isinstance(known, ClientFaultAsWarning) for known in logger.filters):
            logger.addFilter(ClientFaultAsWarning())


class JsonFormatter(logging.Formatter):
    """{"ts": ..., "level": ..., "logger": ..., "message": ..., "event": ..., <extra>...}."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message_of(record),
        }
        line.update(extra_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """`<time> <LEVEL> <logger> <message> key=value ...`, a traceback folded into the line."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [self.formatTime(record), record.levelname, record.name, message_of(record)]
        parts += [f"{k}={v}" for k, v in extra_fields(record).items()]
        if record.exc_info:
            parts.append(self.formatException(record.exc_info))
        return " ".join(parts).replace("\n", "\\n")
