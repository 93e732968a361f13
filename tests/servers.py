"""Real server processes for tests: gunicorn serving the test database and test Redis, a Celery
worker (that a test may pause and SIGKILL), and what a test watches them by."""

import http.client
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"  # screenshots of the browser tests (gitignored)
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Headless, and nothing that reaches out (the browser tests run without the internet).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def admin_added_activity(page: Any, label: str) -> tuple[int, Any]:
    """After the admin's "Save" of a new activity whose name ends in `label` (its total, count
    and strategy, as "8.88 × 8 (pessimistic)"): its id, read from the "added" message, and its
    row of the change list. Not the first row holding the amount: another activity's text may
    hold it too (the demo's draw their amounts at random)."""
    from playwright.sync_api import expect

    added = page.locator(".messagelist", has_text="was added successfully")
    expect(added).to_contain_text(label)
    found = re.search(r"#(\d+) " + re.escape(label), added.inner_text())
    assert found is not None, added.inner_text()
    activity = int(found.group(1))
    row = page.locator("#result_list tbody tr").filter(
        has=page.locator(".field-id", has_text=re.compile(rf"^{activity}$"))
    )
    return activity, row


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


def python_child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`code` run by this Python in a fresh process from the project's root, its output as
    text."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def wait_until_answers(url: str, process: subprocess.Popen, what: str) -> None:
    """Until `url` answers 200; RuntimeError when `process` died or after a minute."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not come up") from None
            time.sleep(0.2)


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
def gunicorn(workers: int = 2, threads: int = 16, **env: str) -> Iterator[str]:
    """A gunicorn serving the app on a free port (with gunicorn.conf.py, as everywhere, so its
    /metrics sums its workers), `env` added to its environment; yields its base URL."""
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
        env=service_env(**env),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_answers(f"{base}/healthz", process, "gunicorn")
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


def kill_hard(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 90) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def uncommitted_rows() -> int:
    """Rows written by the open transactions of connections to this test database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(MAX(t.trx_rows_modified), 0) FROM information_schema.INNODB_TRX t "
            "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
            "WHERE p.DB = DATABASE()"
        )
        return int(cursor.fetchone()[0])


class Answers:
    """The answers on a socket, read one at a time by http.client (each body by its length or
    its chunks, none for an answer to HEAD) from one buffered reader, which an answer read
    leaves open."""

    def __init__(self, sock: socket.socket | io.BufferedReader) -> None:
        self.reader = sock.makefile("rb") if isinstance(sock, socket.socket) else sock

    def makefile(self, mode: str) -> "Answers":
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)

    def close(self) -> None:
        pass

    def next(self, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
        """The next answer's status, headers (names in lower case) and body, `method` the
        request's."""
        answer = http.client.HTTPResponse(self, method=method)  # type: ignore[arg-type]
        answer.begin()
        headers = {name.lower(): value for name, value in answer.getheaders()}
        return answer.status, headers, answer.read()

    def next_status(self) -> int:
        return self.next()[0]

    def until_closed(self) -> list[int]:
        """The statuses of every answer until the server closes the connection."""
        statuses = []
        while self.reader.peek(1):
            statuses.append(self.next_status())
        return statuses


def raw_request(
    base: str, request: bytes, *, end: bool = False
) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as is on a new connection (`end`: then close the sending side, as a
    client that has nothing more to send); the status, headers and body of the first answer
    (all read until the server closes)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        if end:
            sock.shutdown(socket.SHUT_WR)
        answer = read_until_closed(sock)
    return Answers(io.BufferedReader(io.BytesIO(answer))).next()  # type: ignore[arg-type]


def read_until_closed(sock: socket.socket) -> bytes:
    """Every byte the server sends until it closes the connection (a reset, when it closed with
    some of what was sent unread, ends it too)."""
    answer = b""
    with suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            answer += chunk
    return answer
