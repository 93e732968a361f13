"""Real server processes for tests: gunicorn serving the test database and test Redis."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_env(**extra: str) -> dict[str, str]:
    """The environment that points a child process at this test run's database and Redis."""
    db = settings.DATABASES["default"]
    url = (
        f"mysql://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 3306}/{db['NAME']}"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "redpack.settings",
        "DATABASE_URL": url,
        "REDIS_URL": settings.CACHES["default"]["LOCATION"],
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "SECRET_KEY": settings.SECRET_KEY,
        "DEBUG": "0",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # each server makes its own (gunicorn.conf.py)
    env.update(extra)
    return env


def call(method: str, url: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    """One JSON request with a bearer token: (status, body), errors included."""
    request = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def scrape(base: str) -> list:
    """The metric families of a server's /metrics (asked from loopback, so allowed)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
        return list(text_string_to_metric_families(response.read().decode()))


def grabs_by_outcome(base: str, strategy: str) -> Counter[str]:
    """redpack_grabs_total of one strategy on one server, by outcome."""
    counts: Counter[str] = Counter()
    for family in scrape(base):
        for sample in family.samples:
            if sample.name == "redpack_grabs_total" and sample.labels["strategy"] == strategy:
                counts[sample.labels["outcome"]] += int(sample.value)
    return counts


@contextmanager
def gunicorn(workers: int = 2, threads: int = 16) -> Iterator[str]:
    """A gunicorn serving the app on a free port (with gunicorn.conf.py, as everywhere, so its
    /metrics sums its workers); yields its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "redpack.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=service_env(),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("gunicorn did not come up") from None
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def celery_worker(
    schedule: Path, *, pause: str | None = None, **env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`celery -A redpack worker -B` in a process group of its own (so SIGKILL takes it all).

    `pause` ("before_commit:300"): the persister stops there in every batch
    (tests/paused_worker.py)."""
    launcher = ["tests.paused_worker", pause] if pause else ["celery"]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            *launcher,
            "-A",
            "redpack",
            "worker",
            "-B",
            "--pool",
            "solo",
            "--loglevel",
            "ERROR",
            "--schedule",
            str(schedule),
        ],
        cwd=ROOT,
        env=service_env(**env),
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
