"""`make run`: choose the backends once, prepare them, start the Procfile under honcho, say so.

    python -m redpack.launch run [--host H --port P --locust-port L ...]
    python -m redpack.launch redis     # the Procfile's `redis` process (embedded Redis only)

Backends, decided once, in this order, and written to .run/run.env for every process:

- database: DATABASE_URL when set; else the local MariaDB/MySQL (REDPACK_LOCAL_MYSQL,
  default 127.0.0.1:3306, as root without a password) when it answers; else SQLite in
  .run/redpack.sqlite3.
- Redis: REDIS_URL when set; else the local Redis (REDPACK_LOCAL_REDIS, default
  127.0.0.1:6379) when it answers; else an embedded one on a free port, run as the Procfile's
  `redis` process: a real `redis-server` child when the binary is installed, else fakeredis's
  in-process server (Lua included). REDPACK_EMBEDDED_REDIS=redis-server|fakeredis forces one.
  The Celery broker is CELERY_BROKER_URL, else another database number of that Redis.

REDPACK_LOCAL_MYSQL / REDPACK_LOCAL_REDIS take host:port or `off` (skip the probe), which is
also how the tests play "MySQL and Redis unreachable" without stopping anybody's server.
"""

import argparse
import contextlib
import io
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redpack import dberrors

ROOT = Path(__file__).resolve().parent.parent
RUN_DIR = ROOT / ".run"
RUN_ENV = RUN_DIR / "run.env"
LOCUSTFILE = "locustfiles/mixed.py"  # the Procfile's `locust` line runs this scenario
DEMO_LOGIN = ("admin", "admin")
BENCH_USERS = 200  # the Locust UI's users (.run/bench-users.csv)
PROBE_TIMEOUT = 2.0


@dataclass
class Backends:
    database_url: str
    redis_url: str
    broker_url: str
    database_note: str
    redis_note: str
    embedded_redis: str | None = None  # "redis-server" or "fakeredis": the `redis` process
    # The demo admin (admin / admin) is made only on a database `make run` chose itself (the
    # local `redpack` database or embedded SQLite), or when REDPACK_DEMO_ADMIN asks for it.
    demo_admin: bool = True
    embedded_redis_port: int | None = None
    reasons: list[str] = field(default_factory=list)  # why an embedded default was chosen

    @property
    def embedded(self) -> bool:
        return self.database_url.startswith("sqlite:") or self.embedded_redis is not None

    @property
    def embedded_parts(self) -> str:
        """What runs embedded, for the pages' ribbon (REDPACK_EMBEDDED); empty: nothing."""
        parts = [self.database_note] if self.database_url.startswith("sqlite:") else []
        if self.embedded_redis is not None:
            parts.append(self.redis_note)
        return "; ".join(parts)


def _host_port(target: str, default_port: int) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return (host, int(port)) if host else (target, default_port)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe_mysql(target: str) -> str | None:
    """None when MariaDB/MySQL at host:port takes root without a password, else why not."""
    if target == "off":
        return "local probe off (REDPACK_LOCAL_MYSQL=off)"
    host, port = _host_port(target, 3306)
    try:
        import MySQLdb
    except ImportError:
        return "the MySQL driver is not installed (needs pkg-config and libmariadb-dev)"
    try:
        MySQLdb.connect(
            host=host, port=port, user="root", password="", connect_timeout=int(PROBE_TIMEOUT)
        ).close()
    except MySQLdb.OperationalError as exc:
        if dberrors.code(exc) in dberrors.UNREACHABLE:
            return f"no MariaDB/MySQL answers at {host}:{port}"
        if dberrors.code(exc) in dberrors.REFUSED:
            return f"MariaDB/MySQL at {host}:{port} takes no more connections ({exc})"
        return f"MariaDB/MySQL at {host}:{port} refuses root without a password ({exc})"
    return None


def probe_redis(target: str) -> str | None:
    """None when a Redis at host:port answers PING, else why not."""
    if target == "off":
        return "local probe off (REDPACK_LOCAL_REDIS=off)"
    host, port = _host_port(target, 6379)
    import redis

    client = redis.Redis(
        host=host, port=port, socket_timeout=PROBE_TIMEOUT, socket_connect_timeout=PROBE_TIMEOUT
    )
    try:
        client.ping()
    except redis.RedisError:
        return f"no Redis answers at {host}:{port}"
    finally:
        client.close()
    return None


def other_database(url: str) -> str:
    """The same Redis server, another database number (the broker beside the packet state)."""
    parts = urlsplit(url)
    current = parts.path.strip("/") or "0"
    other = "1" if current != "1" else "2"
    return urlunsplit(parts._replace(path=f"/{other}"))


def redact(url: str) -> str:
    """The URL without its password, to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def decide(environ: dict[str, str]) -> Backends:
    reasons = []
    database_url = environ.get("DATABASE_URL", "")
    if database_url:
        database_note = f"DATABASE_URL ({redact(database_url)})"
    else:
        target = environ.get("REDPACK_LOCAL_MYSQL", "127.0.0.1:3306")
        problem = probe_mysql(target)
        if problem is None:
            host, port = _host_port(target, 3306)
            database_url = f"mysql://root:@{host}:{port}/redpack"
            database_note = f"local MariaDB/MySQL at {host}:{port}"
        else:
            database_url = f"sqlite:///{RUN_DIR / 'redpack.sqlite3'}"
            database_note = "embedded SQLite (.run/redpack.sqlite3)"
            reasons.append(problem)

    embedded_redis, embedded_port = None, None
    redis_url = environ.get("REDIS_URL", "")
    if redis_url:
        redis_note = f"REDIS_URL ({redact(redis_url)})"
    else:
        target = environ.get("REDPACK_LOCAL_REDIS", "127.0.0.1:6379")
        problem = probe_redis(target)
        if problem is None:
            host, port = _host_port(target, 6379)
            redis_url = f"redis://{host}:{port}/0"
            redis_note = f"local Redis at {host}:{port}"
        else:
            reasons.append(problem)
            embedded_redis = environ.get("REDPACK_EMBEDDED_REDIS", "auto")
            if embedded_redis == "auto":
                embedded_redis = "redis-server" if shutil.which("redis-server") else "fakeredis"
            if embedded_redis not in ("redis-server", "fakeredis"):
                raise SystemExit(
                    f"REDPACK_EMBEDDED_REDIS must be auto, redis-server or fakeredis, "
                    f"not {embedded_redis!r}"
                )
            embedded_port = free_port()
            redis_url = f"redis://127.0.0.1:{embedded_port}/0"
            redis_note = (
                f"embedded redis-server child on port {embedded_port}"
                if embedded_redis == "redis-server"
                else f"embedded fakeredis (in-process, Lua via lupa) on port {embedded_port}"
            )
    broker_url = environ.get("CELERY_BROKER_URL", "") or other_database(redis_url)
    return Backends(
        database_url=database_url,
        redis_url=redis_url,
        broker_url=broker_url,
        database_note=database_note,
        redis_note=redis_note,
        demo_admin=not environ.get("DATABASE_URL")
        or environ.get("REDPACK_DEMO_ADMIN", "").lower() in {"1", "on", "true", "yes"},
        embedded_redis=embedded_redis,
        embedded_redis_port=embedded_port,
        reasons=reasons,
    )


def run_environment(backends: Backends, args: argparse.Namespace) -> dict[str, str]:
    """What every process of the Procfile gets (written to .run/run.env)."""
    web_url = f"http://{args.host}:{args.port}"
    values = {
        "DATABASE_URL": backends.database_url,
        "REDIS_URL": backends.redis_url,
        "CELERY_BROKER_URL": backends.broker_url,
        "REDPACK_WEB_BIND": f"{args.host}:{args.port}",
        "REDPACK_WEB_URL": web_url,
        "REDPACK_WEB_WORKERS": str(args.web_workers),
        "REDPACK_WEB_THREADS": str(args.web_threads),
        "REDPACK_WORKER_CONCURRENCY": str(args.worker_concurrency),
        "REDPACK_LOCUST_HOST": args.host,
        "REDPACK_LOCUST_PORT": str(args.locust_port),
        "REDPACK_LOCUST_URL": locust_url(args) if (ROOT / LOCUSTFILE).exists() else "",
        "REDPACK_EMBEDDED": backends.embedded_parts,
        "REDPACK_FLOWER_HOST": args.host,
        "REDPACK_FLOWER_PORT": str(args.flower_port),
        "REDPACK_USERS_CSV": str(RUN_DIR / "bench-users.csv"),
        "LOG_FORMAT": os.environ.get("LOG_FORMAT", "plain"),  # people read `make run`
        "PYTHONUNBUFFERED": "1",  # log lines reach honcho as they happen
    }
    if backends.embedded_redis:
        values["REDPACK_EMBEDDED_REDIS"] = backends.embedded_redis
        values["REDPACK_EMBEDDED_REDIS_PORT"] = str(backends.embedded_redis_port)
    return values


def locust_url(args: argparse.Namespace) -> str:
    return f"http://{args.host}:{args.locust_port}/"


def chosen_processes(
    backends: Backends, args: argparse.Namespace, *, with_locust: bool
) -> list[str]:
    """The Procfile's processes this run starts: web, worker and one beat always; the Locust UI
    when its scenario is in the checkout; Flower when asked (make run FLOWER_PORT=5555); the
    embedded Redis when no Redis was found."""
    processes = ["web", "worker", "beat"]
    if with_locust:
        processes.append("locust")
    if args.flower_port:
        processes.append("flower")
    if backends.embedded_redis:
        processes.insert(0, "redis")
    return processes


def write_env(values: dict[str, str]) -> None:
    RUN_DIR.mkdir(exist_ok=True)
    lines = ["# Written by `make run` (redpack/launch.py): the backends this run chose."]
    lines += [f"{key}={shlex.quote(value)}" for key, value in values.items()]
    RUN_ENV.write_text("\n".join(lines) + "\n")


def say(message: str = "") -> None:
    print(f"{time.strftime('%H:%M:%S')} run     | {message}" if message else "", flush=True)


class SayHandler(logging.Handler):
    """This process's log lines, prefixed like honcho's."""

    def emit(self, record: logging.LogRecord) -> None:
        say(self.format(record))


def say_logs() -> None:
    root = logging.getLogger()
    handler = SayHandler()
    handler.setFormatter(root.handlers[0].formatter if root.handlers else None)
    root.handlers = [handler]


def command(name: str, **options: object) -> None:
    """A management command in this process, its output said line by line."""
    from django.core.management import call_command
    from django.db import connections

    out = io.StringIO()
    try:
        call_command(name, stdout=out, **options)
    finally:
        connections.close_all()  # nothing here holds a connection (or a SQLite lock) open
        for line in out.getvalue().splitlines():
            say(f"{name}: {line}")


def prepare(*, demo_admin: bool) -> None:
    """Database, static files, the demo admin and bench users: nothing here needs Redis."""
    import django

    django.setup()
    say_logs()
    command("create_database")
    command("migrate", interactive=False, verbosity=0)
    command("collectstatic", interactive=False, verbosity=0)
    if demo_admin:  # created once, never reset (create_demo_admin)
        command("create_demo_admin", username=DEMO_LOGIN[0], password=DEMO_LOGIN[1])
    command("create_bench_users", count=BENCH_USERS, output=os.environ["REDPACK_USERS_CSV"])


def fetch_health(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        return json.load(exc) if exc.code == 503 else None
    except (OSError, ValueError):
        return None


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def banner(backends: Backends, args: argparse.Namespace, *, with_locust: bool) -> list[str]:
    web = f"http://{args.host}:{args.port}"
    user, password = DEMO_LOGIN
    login = (
        f"log in as {user} / {password}"
        if backends.demo_admin
        else "your DATABASE_URL's users; `manage.py createsuperuser` makes one"
    )
    lines = [
        f"  start     {web}/   (what this is, and links to everything below)",
        f"  admin     {web}/admin/   ({login})",
        f"  API docs  {web}/api/docs/",
        f"  API       {web}/api/   (token: POST /api/token/ with username and password)",
        f"  health    {web}/healthz",
        f"  report    {web}/admin/redpack/activity/report/   (strategies measured here)",
    ]
    if with_locust:
        lines.append(f"  Locust    {locust_url(args)}   ({LOCUSTFILE})")
    else:
        lines.append(f"  Locust    off: {LOCUSTFILE} is not in this checkout")
    lines.append(f"  metrics   {web}/metrics   (Prometheus; from this machine)")
    if args.flower_port:
        lines.append(f"  Flower    http://{args.host}:{args.flower_port}/   (Celery tasks)")
    lines += [
        f"  database  {backends.database_note}",
        f"  redis     {backends.redis_note}",
        f"  bench     {BENCH_USERS} users with tokens in .run/bench-users.csv (also for Locust)",
    ]
    if backends.embedded:
        lines.append(
            "  EMBEDDED MODE: numbers measured on this run are not benchmarks "
            "(set DATABASE_URL / REDIS_URL, or start MariaDB and Redis, for real ones)"
        )
    lines.append("  Ctrl-C stops every process.")
    return lines


@contextlib.contextmanager
def own_terminal_group() -> Iterator[None]:
    """Make this process (and so honcho and its processes) the terminal's foreground process
    group, `make` left out of it: a Ctrl-C reaches only them, they stop, this returns 0, and make
    exits 0 instead of dying of the same SIGINT (`make: *** [run] Interrupt` / `Error 130`).
    Without a terminal nothing changes. The terminal is given back on the way out."""
    try:
        fd = sys.stdin.fileno()
        previous = os.tcgetpgrp(fd) if os.isatty(fd) else None
        if previous is not None:
            os.setpgid(0, 0)
    except (OSError, ValueError):
        previous = None
    if previous is None:
        yield
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may now take it
    try:
        os.tcsetpgrp(fd, os.getpgrp())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, previous)
        signal.signal(signal.SIGTTOU, old)


def run(args: argparse.Namespace) -> int:
    import environ

    environ.Env.read_env(ROOT / ".env", overwrite=False)
    backends = decide(dict(os.environ))
    values = run_environment(backends, args)
    write_env(values)
    os.environ.update(values)
    say(f"database: {backends.database_note}")
    say(f"redis:    {backends.redis_note}; Celery broker {redact(backends.broker_url)}")
    for reason in backends.reasons:
        say(f"  (fallback because: {reason})")
    if backends.embedded:
        say("embedded mode: fine to click around, but numbers from it are not benchmarks")

    with_locust = (ROOT / LOCUSTFILE).exists()
    processes = chosen_processes(backends, args, with_locust=with_locust)
    if not with_locust:
        say(f"Locust UI off: {LOCUSTFILE} is not in this checkout")
    say("preparing the database (migrate, static files, demo admin, bench users)")
    prepare(demo_admin=backends.demo_admin)

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    say(f"starting {', '.join(processes)} under honcho (Procfile, .run/run.env)")
    honcho = subprocess.Popen(
        [str(bin_dir / "honcho"), "start", "-f", "Procfile", "-e", str(RUN_ENV), *processes],
        cwd=ROOT,
        env=env,
    )
    announcer = threading.Thread(
        target=announce, args=(backends, args, with_locust, honcho), daemon=True
    )
    announcer.start()

    # A terminal's Ctrl-C reaches honcho itself; a signal sent to this process alone is passed
    # on. Either way honcho stops every process (SIGTERM, SIGKILL after 5 s) and then exits.
    asked_to_stop = threading.Event()

    def pass_on(signum: int, frame: object) -> None:
        asked_to_stop.set()
        honcho.send_signal(signum)

    signal.signal(signal.SIGINT, pass_on)
    signal.signal(signal.SIGTERM, pass_on)
    code = honcho.wait()
    if asked_to_stop.is_set():
        say("stopped")
        return 0  # stopping was asked for: not a failure (make would say `Error 130`)
    say(f"stopped (honcho exited with {code})")
    return code


def announce(
    backends: Backends, args: argparse.Namespace, with_locust: bool, honcho: subprocess.Popen
) -> None:
    """Wait for /healthz (and Locust), seed the demo once the database and Redis answer."""
    web = f"http://{args.host}:{args.port}"
    deadline = time.monotonic() + args.ready_timeout
    seeded = False
    health: dict | None = None
    while honcho.poll() is None and time.monotonic() < deadline:
        health = fetch_health(web)
        # degraded: the database and Redis answer, the broker or the worker not yet.
        if health and health.get("status") in {"ok", "degraded"}:
            if not seeded:
                seeded = True
                try:
                    # An embedded Redis without its data (fakeredis, restarted) forgot the open
                    # activities' state: rebuilt from the database before anybody grabs.
                    command("redis_rebuild", if_lost=True)
                except Exception as exc:  # noqa: BLE001 - /healthz and the admin say degraded
                    say(f"redis_rebuild failed: {exc!r}")
                try:
                    command("seed_demo")
                except Exception as exc:  # noqa: BLE001 - the stack runs on without a demo
                    say(f"seed_demo failed: {exc!r}")
            locust_up = not with_locust or answers(f"http://{args.host}:{args.locust_port}/")
            if health["status"] == "ok" and locust_up:
                say()
                say("redpack is ready")
                for line in banner(backends, args, with_locust=with_locust):
                    say(line)
                say()
                return
        time.sleep(0.5)
    if honcho.poll() is None:
        say(f"not ready after {args.ready_timeout:.0f} s; /healthz says: {json.dumps(health)}")


def keep_connection_after_errors(handler: Any) -> type:
    """fakeredis's TCP server closes a connection after any error reply; a real Redis keeps it.

    The difference breaks clients: redis-py answers NOSCRIPT with SCRIPT LOAD on the same
    connection (every first EVALSHA), kombu's consumer reconnects. Here an error is written as
    the reply to its command and the connection goes on.
    """
    import redis

    class KeepConnection(handler):  # type: ignore[misc]
        def setup(self) -> None:
            super().setup()
            read_response = self.current_client.read_response

            def reply_or_error(**kwargs: object) -> object:
                try:
                    return read_response(**kwargs)
                except (redis.ResponseError, redis.AuthenticationError) as exc:
                    return exc  # written as an error reply, like any other reply

            self.current_client.read_response = reply_or_error

    return KeepConnection


def serve_embedded_redis() -> int:
    """The Procfile's `redis` process: exec redis-server, or serve fakeredis until signalled."""
    kind = os.environ["REDPACK_EMBEDDED_REDIS"]
    port = os.environ["REDPACK_EMBEDDED_REDIS_PORT"]
    if kind == "redis-server":
        data = Path(os.environ.get("REDPACK_EMBEDDED_REDIS_DIR", RUN_DIR / "redis"))
        data.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("redis-server") or "redis-server"
        # Append-only file in .run/redis: packet state outlives a restart, like the SQLite file.
        os.execv(
            binary,
            [binary, "--bind", "127.0.0.1", "--port", port, "--dir", str(data)]
            + ["--appendonly", "yes", "--save", "", "--maxmemory-policy", "noeviction"],
        )
    from fakeredis import TcpFakeServer

    server = TcpFakeServer(("127.0.0.1", int(port)), server_type="redis")
    server.RequestHandlerClass = keep_connection_after_errors(server.RequestHandlerClass)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"fakeredis listening on 127.0.0.1:{port} (in memory: gone when it stops)", flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m redpack.launch", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("run", help="choose backends, prepare, start everything")
    start.add_argument("--host", default="127.0.0.1")
    start.add_argument("--port", type=int, default=8000)
    start.add_argument("--locust-port", type=int, default=8089)
    start.add_argument("--web-workers", type=int, default=2)
    start.add_argument("--web-threads", type=int, default=32)
    start.add_argument("--worker-concurrency", type=int, default=2)
    start.add_argument("--flower-port", type=int, default=0, help="start Flower there (0: off)")
    start.add_argument("--ready-timeout", type=float, default=120.0)
    commands.add_parser("redis", help="the embedded Redis (the Procfile's `redis` process)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    if args.command == "redis":
        return serve_embedded_redis()
    try:
        with own_terminal_group():
            return run(args)
    except KeyboardInterrupt:  # Ctrl-C before honcho started: nothing to stop, nothing failed
        return 0


if __name__ == "__main__":
    sys.exit(main())
