"""Settings that switch things on from the environment, checked in fresh processes."""

import gzip
import http.server
import subprocess
import sys
import threading

from tests.servers import ROOT, python_child, service_env

REPORT = (
    "import django; django.setup(); import sentry_sdk; "
    "print(sentry_sdk.get_client().is_active()); "
    "sentry_sdk.capture_exception(ValueError('boom from redpack')); sentry_sdk.flush(5)"
)


def decoded(body: bytes, encoding: str | None) -> bytes:
    """sentry-sdk compresses with brotli when it is installed, else gzip."""
    if encoding == "br":
        import brotli  # present whenever sentry-sdk chose it

        return bytes(brotli.decompress(body))
    return gzip.decompress(body) if encoding == "gzip" else body


def test_sentry_reports_errors_only_when_a_dsn_is_set():
    received: list[bytes] = []

    class FakeSentry(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(decoded(body, self.headers.get("Content-Encoding")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), FakeSentry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dsn = f"http://public@127.0.0.1:{server.server_port}/1"
        runs = {
            configured: subprocess.run(
                [sys.executable, "-c", REPORT],
                cwd=ROOT,
                env=service_env(SENTRY_DSN=dsn if configured else ""),
                capture_output=True,
                text=True,
                timeout=60,
            )
            for configured in (False, True)
        }
    finally:
        server.shutdown()
    assert runs[False].stdout.strip() == "False"
    assert runs[True].stdout.strip() == "True", runs[True].stderr
    assert len(received) == 1 and b"boom from redpack" in received[0]


NICE_REPORT = (
    "import os, django; django.setup(); from celery import signals; import redpack.celery; "
    "before = os.nice(0); signals.worker_init.send(sender=None); print(os.nice(0) - before)"
)


def test_the_worker_yields_the_cpu_by_its_setting():
    """The Celery worker lowers its own priority at start (its pool forks after), by
    REDPACK_WORKER_NICE; 0 leaves it; a value outside 0..19 is refused at settings load."""

    def added(value: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", NICE_REPORT],
            cwd=ROOT,
            env=service_env(REDPACK_WORKER_NICE=value),
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert added("7").stdout.strip() == "7", added("7").stderr
    assert added("0").stdout.strip() == "0"
    refused = added("-5")
    assert refused.returncode != 0 and "REDPACK_WORKER_NICE must be 0 to 19" in refused.stderr


READ_TIMEOUT_REPORT = (
    "import sys; {load}; from django.conf import settings; "
    "print(settings.DATABASES['default']['OPTIONS'].get('read_timeout'))"
)


def test_the_web_process_waits_for_a_mysql_reply_only_so_long():
    """The web process's MySQL connections give up on a reply after DB_READ_TIMEOUT (90 s
    unless set, also in .env: redpack/wsgi.py marks the process), so a MySQL that stalls
    without closing frees its threads;
    a Celery worker after 300 s unless set; another process (a migration) waits for as long as
    a statement takes unless it is set."""

    def read_timeout(load: str, **extra: str) -> str:
        env = service_env()
        # Whatever this process holds (a test before may have loaded redpack.wsgi here), the
        # child's are the ones given.
        env.pop("DB_READ_TIMEOUT", None)
        env.pop("REDPACK_WEB_PROCESS", None)
        env.update(extra)
        done = python_child(READ_TIMEOUT_REPORT.format(load=load), env)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip()

    assert read_timeout("import redpack.wsgi") == "90"
    assert read_timeout("import redpack.wsgi", DB_READ_TIMEOUT="5") == "5"
    assert read_timeout("import redpack.wsgi", DB_READ_TIMEOUT="0") == "None"
    assert read_timeout("import django; django.setup()") == "None"
    assert read_timeout("import django; django.setup()", DB_READ_TIMEOUT="5") == "5"
    # A Celery worker, as it starts (worker_init, before its pool forks): 300 s unless set.
    worker = (
        "import django; django.setup(); from celery import signals; import redpack.celery; "
        "signals.worker_init.send(sender=None)"
    )
    assert read_timeout(worker) == "300"
    assert read_timeout(worker, DB_READ_TIMEOUT="5") == "5"
    assert read_timeout(worker, DB_READ_TIMEOUT="0") == "None"
