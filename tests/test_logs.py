"""One line per event: the formatters, and the events the grab service logs."""

import json
import logging
import sys
import time
import uuid

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import OperationalError
from django.test import override_settings
from rest_framework_simplejwt.tokens import AccessToken

from redpack import celery_app, logs, services, tasks
from redpack.logs import JsonFormatter, PlainFormatter
from strategies.base import Outcome

from .dummy_strategies import DUMMIES


def record_with_traceback() -> logging.LogRecord:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("redpack.x", logging.ERROR, __file__, 1, "grab %s", (7,), exc_info)
    record.event = "grab_failed"
    record.activity = 7
    return record


def test_json_lines_carry_the_event_fields_and_the_traceback():
    line = JsonFormatter().format(record_with_traceback())
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "grab 7" and data["level"] == "ERROR"
    assert (data["event"], data["activity"]) == ("grab_failed", 7)
    assert "ValueError: boom" in data["exc"]


def test_plain_lines_are_one_line_with_key_values():
    line = PlainFormatter().format(record_with_traceback())
    assert "\n" not in line
    assert "ERROR redpack.x grab 7 event=grab_failed activity=7" in line
    assert "ValueError: boom" in line


def test_log_format_defaults_to_json_without_debug():
    assert settings.DEBUG is False
    assert settings.LOGGING["handlers"]["console"]["formatter"] == "json"


@pytest.fixture
def dummies():  # type: ignore[no-untyped-def]
    with override_settings(REDPACK_STRATEGIES={**settings.REDPACK_STRATEGIES, **DUMMIES}):
        yield


def activity_of(strategy: str, sender) -> int:  # type: ignore[no-untyped-def]
    return services.activity_send(
        sender_id=sender.pk, total_amount="1.00", total_count=1, strategy=strategy
    ).pk


def events(caplog) -> list[dict]:  # type: ignore[no-untyped-def]
    return [
        {k: getattr(r, k) for k in ("event", "activity", "user") if hasattr(r, k)}
        for r in caplog.records
        if hasattr(r, "event")
    ]


@pytest.mark.django_db
def test_grab_events(dummies, sender, caplog):  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="redpack")
    contended, broken, locked = (
        activity_of(name, sender) for name in ("contended", "broken", "lock_timeout")
    )
    caplog.clear()
    assert services.activity_grab(activity_id=contended, user_id=5).outcome is Outcome.CONTENDED
    with pytest.raises(RuntimeError):
        services.activity_grab(activity_id=broken, user_id=5)
    # A lock wait that gave up rolled everything back: the user is told to retry, not a 500.
    assert services.activity_grab(activity_id=locked, user_id=5).outcome is Outcome.CONTENDED
    assert events(caplog) == [
        {"event": "grab_contended", "activity": contended, "user": 5},
        {"event": "grab_failed", "activity": broken, "user": 5},
        {"event": "lock_timeout", "activity": locked, "user": 5},
    ]
    assert caplog.records[1].exc_info is not None  # the unexpected one keeps its traceback


@pytest.mark.django_db
def test_a_contended_grab_answered_over_http_is_one_line(
    dummies, client, sender, make_users, caplog
):  # type: ignore[no-untyped-def]
    """Its `grab_contended` event, and not django.request's WARNING for the 409 besides (a hot
    burst answers thousands); another 4xx keeps Django's line."""
    caplog.set_level(logging.INFO)
    (grabber,) = make_users(1)
    token = f"Bearer {AccessToken.for_user(grabber)}"
    contended = activity_of("contended", sender)
    caplog.clear()
    answer = client.post(f"/api/activities/{contended}/grab/", HTTP_AUTHORIZATION=token)
    assert answer.status_code == 409
    assert events(caplog) == [
        {"event": "grab_contended", "activity": contended, "user": grabber.pk}
    ]
    assert not [r for r in caplog.records if r.name == "django.request"]
    assert client.post("/api/activities/999999/grab/", HTTP_AUTHORIZATION=token).status_code == 404
    (missing,) = [r for r in caplog.records if r.name == "django.request"]
    assert missing.levelno == logging.WARNING and missing.status_code == 404  # type: ignore[attr-defined]


def test_a_host_not_served_is_one_warning_line_without_a_traceback(client, caplog):  # type: ignore[no-untyped-def]
    """Django logs it at ERROR with a traceback; it is the client's fault, answered 400, and a
    scanner sends thousands."""
    caplog.set_level(logging.INFO)
    answer = client.get("/api/ping/", HTTP_HOST="evil.example")
    assert answer.status_code == 400
    (refused,) = [r for r in caplog.records if r.name == "django.security.DisallowedHost"]
    assert (refused.levelno, refused.levelname) == (logging.WARNING, "WARNING")
    assert refused.exc_info is None and "evil.example" in refused.getMessage()
    line = json.loads(JsonFormatter().format(refused))
    assert line["level"] == "WARNING" and "exc" not in line


@pytest.mark.django_db
def test_a_shed_grab_is_one_line_too(dummies, client, sender, make_users, caplog):  # type: ignore[no-untyped-def]
    """The activity's line in this process is full (none here): the 409 `shed` is said by its
    `grab_contended` event, with its reason, since Django's line for it is dropped."""
    caplog.set_level(logging.INFO)
    (grabber,) = make_users(1)
    contended = activity_of("contended", sender)
    caplog.clear()
    with override_settings(REDPACK_GRAB_LINE=0):
        answer = client.post(
            f"/api/activities/{contended}/grab/",
            HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(grabber)}",
        )
    assert answer.status_code == 409 and answer.json()["reason"] == "shed"
    (line,) = [r for r in caplog.records if getattr(r, "event", None)]
    assert (line.event, line.reason, line.user) == ("grab_contended", "shed", grabber.pk)  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.name == "django.request"]


def test_lock_timeouts_are_recognised():
    assert services.is_lock_timeout(OperationalError(1205, "Lock wait timeout exceeded"))
    assert services.is_lock_timeout(OperationalError(1213, "Deadlock found"))
    assert services.is_lock_timeout(OperationalError("database is locked"))
    assert not services.is_lock_timeout(OperationalError(2006, "MySQL server has gone away"))


@pytest.mark.django_db
def test_a_request_id_is_taken_or_made_echoed_and_on_every_line(client, sender, caplog):
    caplog.set_level(logging.INFO, logger="redpack")
    client.force_login(sender)
    response = client.post(
        "/api/activities/",
        {"total_amount": "1.00", "total_count": 1, "strategy": "pessimistic"},
        content_type="application/json",
        HTTP_X_REQUEST_ID="checkout-42",
    )
    assert response.status_code == 201 and response["X-Request-ID"] == "checkout-42"
    (sent,) = [r for r in caplog.records if getattr(r, "event", None) == "activity_sent"]
    assert json.loads(JsonFormatter().format(sent))["request_id"] == "checkout-42"
    assert logs.request_id.get() is None  # not left behind for the thread's next request
    made = client.get("/healthz", HTTP_X_REQUEST_ID="not valid\n")["X-Request-ID"]
    assert len(made) == 32 and made != client.get("/healthz")["X-Request-ID"]


class Kept(logging.Handler):
    """The records of one logger, kept (on that logger itself: the worker's start-up configures
    logging again, which takes the root's handlers away, caplog's included)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.django_db(transaction=True)
def test_a_task_enqueued_during_a_request_logs_its_id_in_the_worker():
    """The id travels in the task's headers through the real broker to a Celery worker (Celery's
    own test worker, in a thread of this process), whose lines while it runs the task carry it
    (here the task_failed line of a refund of no activity, which fails before asking MySQL)."""
    kept = Kept()
    task_logger = logging.getLogger("redpack.tasks")
    task_logger.addHandler(kept)
    queue = f"request-id-{uuid.uuid4().hex}"  # not the runs other tests' beats left queued
    token = logs.request_id.set("req-from-web-7")
    try:
        result = tasks.refund_activity.apply_async(("no-such-activity",), queue=queue)
    finally:
        logs.request_id.reset(token)
    try:
        with start_worker(
            celery_app, pool="solo", queues=[queue], perform_ping_check=False, shutdown_timeout=30
        ):
            deadline = time.monotonic() + 60
            while not failed_lines(kept, result.id) and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        task_logger.removeHandler(kept)
    (line,) = failed_lines(kept, result.id)
    assert line.request_id == "req-from-web-7"  # type: ignore[attr-defined]
    assert logs.request_id.get() is None  # the worker's thread had its own


def failed_lines(kept: Kept, task_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in kept.records
        if getattr(r, "event", None) == "task_failed" and getattr(r, "task_id", None) == task_id
    ]
