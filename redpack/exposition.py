"""GET /metrics: the Prometheus text document of one web server, and who may read it.

The counters and histograms of redpack/metrics.py, summed over the server's worker processes
(prometheus-client's multiprocess mode: gunicorn.conf.py gives each server a directory of its
own; without one, as under `manage.py runserver` or in tests, this process's own), followed by
gauges read from the stores at scrape time, cheaply (a handful of reads, none per grab):

- `redpack_up{check}`: the /healthz probes (database, redis, broker, worker), 1 or 0;
- `redpack_worker_heartbeat_age_seconds`;
- `redpack_persist_lag_seconds`: how long the oldest acknowledged grab has waited for MySQL
  (the strategies that write later; absent while none does), `redpack_persist_pending`;
- `redpack_persist_failures{status}`: grabs that failed to persist; `dead` are the dead letters;
- `redpack_refunds_due`, `redpack_refund_lag_seconds`: refunds due and not under way, and how
  late the oldest one is.

A read that fails leaves its gauges out (and counts a store error, `where="metrics"`); the
scrape still answers. While the database probe fails (a bounded wait: health._Probe), MySQL's
gauges are left out unread; the refund schedule's, read from Redis, stay.

Who may read it: loopback addresses, the networks of REDPACK_METRICS_NETWORKS, and anyone
presenting `Authorization: Bearer <REDPACK_METRICS_TOKEN>` when that is set.
"""

import hmac
import ipaddress
import os
from collections.abc import Iterator
from functools import cache

from django.conf import settings
from django.http import HttpRequest
from prometheus_client import REGISTRY, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from strategies import registry

from . import expiry, health, metrics, selectors


@cache
def _networks(spec: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(text, strict=False) for text in spec)


def allowed(request: HttpRequest) -> bool:
    """A loopback or listed address, or the metrics token as a bearer token."""
    token = settings.REDPACK_METRICS_TOKEN
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, presented = header.partition(" ")
    if token and scheme.lower() == "bearer":
        return hmac.compare_digest(presented.strip().encode(), token.encode())
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if address.is_loopback:
        return True
    return any(address in net for net in _networks(tuple(settings.REDPACK_METRICS_NETWORKS)))


def render() -> bytes:
    return generate_latest(_Document())  # type: ignore[arg-type]


class _Document:
    """What one scrape reads: the instruments, then the stores' gauges."""

    def collect(self) -> Iterator:  # type: ignore[type-arg]
        source: Collector = REGISTRY
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            source = multiprocess.MultiProcessCollector(None)  # type: ignore[no-untyped-call]
        yield from source.collect()
        yield from _state()


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _state() -> Iterator[GaugeMetricFamily]:
    age = health.heartbeat_age()
    up = GaugeMetricFamily("redpack_up", "The /healthz probes: 1 ok, 0 not.", labels=["check"])
    results = health.checks(age)
    for check, result in results.items():
        up.add_metric([check], 1.0 if result == "ok" else 0.0)
    yield up
    if age is not None:
        yield _gauge(
            "redpack_worker_heartbeat_age_seconds", "Seconds since a worker ran the heartbeat.", age
        )
    try:
        lag, sections = registry.health()
    except Exception as exc:  # noqa: BLE001 - a store down leaves these gauges out
        metrics.store_error(exc, "metrics")
    else:
        if lag is not None:
            yield _gauge(
                "redpack_persist_lag_seconds",
                "Seconds the oldest acknowledged grab has waited for MySQL.",
                lag,
            )
        pending = sections.get("persist", {})
        if isinstance(pending, dict) and isinstance(pending.get("pending"), int):
            yield _gauge(
                "redpack_persist_pending",
                "Acknowledged grabs not yet in MySQL.",
                pending["pending"],
            )
    try:  # the schedule, in Redis
        due, late = expiry.refund_lag()
    except Exception as exc:  # noqa: BLE001
        metrics.store_error(exc, "metrics")
    else:
        yield _gauge("redpack_refunds_due", "Refunds due and not under way.", due)
        yield _gauge("redpack_refund_lag_seconds", "Seconds the oldest due refund is late.", late)
    if results["database"] != "ok":
        return  # MySQL's gauges left out: their reads would wait on the request's connection
    try:
        failures = selectors.persist_failure_counts()
    except Exception as exc:  # noqa: BLE001
        metrics.store_error(exc, "metrics")
    else:
        family = GaugeMetricFamily(
            "redpack_persist_failures",
            "Grabs that failed to persist, by status (dead: the dead letters).",
            labels=["status"],
        )
        for status in ("retrying", "dead", "resolved"):
            family.add_metric([status], float(failures.get(status, 0)))
        yield family
