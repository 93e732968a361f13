"""GET /metrics in one process: who may read it, and the gauges read from the stores."""

import json
import re
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import OperationalError
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import ConnectionError as RedisConnectionError
from rest_framework_simplejwt.tokens import AccessToken

from redpack import expiry, health, metrics, services
from redpack.models import PersistFailure, PersistFailureStatus
from strategies.lua import redis_client
from tests.servers import ROOT

pytestmark = pytest.mark.django_db


def samples(response) -> dict:  # type: ignore[no-untyped-def]
    text = response.content.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_loopback_reads_it_and_others_get_a_403_in_the_error_shape(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    assert ("redpack_up", (("check", "database"),)) in samples(response)
    refused = client.get("/metrics", REMOTE_ADDR="203.0.113.7")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"


def test_a_remote_scraper_needs_the_token_or_a_listed_network(client, settings):
    remote = {"REMOTE_ADDR": "10.1.2.3"}
    settings.REDPACK_METRICS_TOKEN = "scrape-me"
    assert (
        client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me", **remote).status_code == 200
    )
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong", **remote).status_code == 403
    assert client.get("/metrics", **remote).status_code == 403
    settings.REDPACK_METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ", **remote).status_code == 403
    settings.REDPACK_METRICS_NETWORKS = ["10.0.0.0/8"]
    assert client.get("/metrics", **remote).status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:10.9.9.9").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.1").status_code == 403


def test_dead_letters_and_late_refunds_are_read_at_scrape_time(client, sender):
    activity = services.activity_send(
        sender_id=sender.pk, total_amount=Decimal("1.00"), total_count=2, strategy="pessimistic"
    )
    for status in (PersistFailureStatus.DEAD, PersistFailureStatus.DEAD, "retrying"):
        PersistFailure.objects.create(
            activity=activity,
            entry_id=f"{PersistFailure.objects.count()}-0",
            payload={},
            user_id=1,
            amount=Decimal("0.50"),
            error="test",
            status=status,
            last_failed_at=timezone.now(),
        )
    activity.expires_at = timezone.now() - timedelta(seconds=30)
    expiry.register([activity])  # due 30 s ago, and nobody claimed it
    found = samples(client.get("/metrics"))
    assert found[("redpack_persist_failures", (("status", "dead"),))] == 2
    assert found[("redpack_persist_failures", (("status", "retrying"),))] == 1
    assert found[("redpack_refunds_due", ())] == 1
    assert found[("redpack_refund_lag_seconds", ())] >= 30


def test_refund_lag_counts_only_what_is_due():
    now = time.time()
    assert expiry.refund_lag(now=now) == (0, 0.0)
    redis_client().zadd(expiry.EXPIRY_KEY, {"1": (now - 5) * 1000, "2": (now + 60) * 1000})
    due, late = expiry.refund_lag(now=now)
    assert due == 1 and late == pytest.approx(5, abs=0.01)


def test_a_throttled_grab_is_counted_by_scope(client, settings, make_users, one_throttle_window):
    settings.REDPACK_THROTTLE_RATES = {"grab": "1/min", "send": None}
    (user,) = make_users(1)
    before = REGISTRY.get_sample_value("redpack_throttled_total", {"scope": "grab"}) or 0
    auth = {"HTTP_AUTHORIZATION": f"Bearer {AccessToken.for_user(user)}"}
    codes = [client.post("/api/activities/999/grab/", **auth).status_code for _ in range(3)]
    assert codes == [404, 429, 429]
    after = REGISTRY.get_sample_value("redpack_throttled_total", {"scope": "grab"})
    assert after == before + 2


def test_store_errors_are_told_apart_through_their_causes():
    try:
        try:
            raise RedisConnectionError("gone")
        except RedisConnectionError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert metrics.store_of(wrapped) == "redis"
    assert metrics.store_of(OperationalError(2013, "lost")) == "mysql"
    assert metrics.store_of(ValueError("no store")) is None


def test_the_grafana_dashboard_asks_only_for_what_the_document_has(client):
    """Every redpack_* series the dashboard in deploy/ queries is in /metrics."""
    health.record_heartbeat()
    text = client.get("/metrics").content.decode()
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        names.add(name)
        if kind == "histogram":
            names.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    queried = {
        series
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for series in re.findall(r"\bredpack_[a-z_]+", target["expr"])
    }
    assert queried and queried <= names, queried - names
