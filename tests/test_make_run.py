"""`make run` as a newcomer runs it: from a clean checkout, until Ctrl-C.

The checkout is the files git tracks or would track (no .venv, .env or .run), so the first run
creates the virtualenv (a minute or two). It runs twice: on this machine's MariaDB and Redis
(given by URL, in databases of its own), and with both unreachable (a probe of a port nobody
listens on), where it falls back to SQLite and the in-process fakeredis. Each run must print
"ready", serve the admin, a grab and the Locust UI, and leave no process behind after Ctrl-C.
The admin is also driven in Chromium (Debian's package) through Playwright; the screenshot goes
to artifacts/admin.png.
"""

import contextlib
import csv
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import MySQLdb
import pytest
import redis
from django.conf import settings

from redpack.health import CACHE_SECONDS

from .servers import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, ROOT, admin_added_activity, free_port

FIRST_RUN_TIMEOUT = 900  # creates the virtualenv
READY = "redpack is ready"
# The stack of the first run keeps its packet state and broker here, apart from the tests' own.
RUN_REDIS_URL = os.environ.get("TEST_RUN_REDIS_URL", "redis://127.0.0.1:6379/13")
RUN_BROKER_URL = os.environ.get("TEST_RUN_CELERY_BROKER_URL", "redis://127.0.0.1:6379/12")
# What a newcomer's shell would not have: this test run's settings, virtualenv and make.
NOT_INHERITED = {
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "SECRET_KEY",
    "DEBUG",
    "DJANGO_SETTINGS_MODULE",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    target = tmp_path_factory.mktemp("checkout") / "redpack"
    for name in filter(None, listed):
        source = ROOT / name.decode()
        if source.is_file():
            (target / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            (target / name.decode()).write_bytes(source.read_bytes())
            (target / name.decode()).chmod(source.stat().st_mode)
    return target


def newcomer_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    path = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(p for p in path if not p.startswith(str(ROOT)))
    env.update(extra)
    return env


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19])


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def descendants(root: int) -> dict[int, int]:
    """Every process under `root` (any session), pid -> start time."""
    children: dict[int, list[int]] = {}
    starts = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))):
            children.setdefault(stat[0], []).append(int(entry.name))
            starts[int(entry.name)] = stat[2]
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


class Stack:
    """A `make run` in its own session, like a terminal's foreground job."""

    def __init__(self, checkout: Path, env: dict[str, str], log: Path) -> None:
        self.checkout = checkout
        self.port, self.locust_port = free_port(), free_port()
        self.web = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.process = subprocess.Popen(
            ["make", "run", f"PORT={self.port}", f"LOCUST_PORT={self.locust_port}"],
            cwd=checkout,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no {text!r} from make run; its output ends:\n{self.output()[-6000:]}")
            time.sleep(0.5)

    @property
    def with_locust(self) -> bool:
        return (self.checkout / "locustfiles" / "mixed.py").exists()

    def run_env(self) -> dict[str, str]:
        """The backends this run chose, from the .run/run.env it wrote."""
        values = {}
        for line in (self.checkout / ".run" / "run.env").read_text().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                values[key] = shlex.split(value)[0]
        return values

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the foreground process group; every process must be gone after."""
        processes = descendants(self.process.pid)
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make run still runs 60 s after Ctrl-C:\n{self.output()[-4000:]}")
        deadline = time.monotonic() + 10
        while True:
            survivors = {
                pid: cmdline(pid)
                for pid, start in processes.items()
                if (stat := proc_stat(pid)) and stat[2] == start and stat[1] != "Z"
            }
            if not survivors or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert survivors == {}, f"still running after Ctrl-C: {survivors}"
        # Stopping was asked for: `make run` itself exits 0 (no `make: *** [run] Error 130`).
        # In a terminal only it takes the foreground (launch.own_terminal_group), so make exits
        # 0 too; here, without one, the SIGINT sent to the whole group reaches make as well.
        assert "run     | stopped\n" in self.output() and "Error 130" not in self.output()
        assert self.process.returncode in (0, -signal.SIGINT), self.output()[-2000:]

    def kill(self) -> None:
        if self.process.poll() is None:
            for pid in descendants(self.process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def start(checkout, tmp_path) -> Iterator:  # type: ignore[no-untyped-def]
    stacks: list[Stack] = []

    def start(env: dict[str, str]) -> Stack:
        stacks.append(Stack(checkout, env, tmp_path / f"make-run-{len(stacks)}.log"))
        return stacks[-1]

    yield start
    for stack in stacks:
        stack.kill()


def call(method: str, url: str, body: dict | None = None, token: str = "") -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"} | ({"Authorization": token} if token else {}),
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def admin_token(stack: Stack) -> str:
    code, body = call("POST", f"{stack.web}/api/token/", {"username": "admin", "password": "admin"})
    assert code == 200, body
    return f"Bearer {body['access']}"


def send(stack: Stack, token: str, *, amount: str, count: int) -> int:
    body = {"total_amount": amount, "total_count": count, "strategy": "pessimistic"}
    code, activity = call("POST", f"{stack.web}/api/activities/", body, token)
    assert code == 201, activity
    return int(activity["id"])


def check_banner_links(stack: Stack) -> None:
    """Every URL the ready banner prints answers (the admin's through its login page)."""
    banner = stack.output().split(READY, 1)[1]
    urls = re.findall(r"(http://127\.0\.0\.1:\d+/\S*)", banner)
    assert f"{stack.web}/" in urls and f"{stack.web}/api/docs/" in urls
    for url in urls:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200, url


def check_serving(stack: Stack) -> None:
    """The admin login page, a grab over the API, the Locust UI, the process list."""
    check_banner_links(stack)
    with urllib.request.urlopen(f"{stack.web}/admin/login/", timeout=10) as response:
        assert response.status == 200 and b"Django administration" in response.read()
    token = admin_token(stack)
    activity = send(stack, token, amount="10.00", count=5)
    code, grab = call("POST", f"{stack.web}/api/activities/{activity}/grab/", None, token)
    assert (code, grab["outcome"]) == (200, "grabbed")
    # Each web process caches its /healthz verdict for up to CACHE_SECONDS: one that last probed
    # just before the worker's first heartbeat says `degraded` until its cache runs out, even
    # after another process told the launcher `ok`. Ready means every process agrees within it.
    deadline = time.monotonic() + 5 * CACHE_SECONDS
    while True:
        code, health = call("GET", f"{stack.web}/healthz")
        if health.get("status") == "ok" or time.monotonic() > deadline:
            break
        time.sleep(CACHE_SECONDS / 4)
    if health.get("status") != "ok":  # which probe, and why, for the failure's message
        health["details"] = call("GET", f"{stack.web}/healthz/details", None, token)[1]
    assert (code, health["status"]) == (200, "ok"), json.dumps(health)
    assert "seed_demo: pessimistic: demo activity" in stack.output()

    commands = [cmdline(pid) for pid in descendants(stack.process.pid)]
    # python <venv>/bin/<program> ...; the `sh -c` wrappers that honcho starts do not count.
    programs = [(Path(c[1]).name, c[2:]) for c in commands if len(c) > 1 and c[0] != "/bin/sh"]
    assert sum(name == "celery" and "beat" in args for name, args in programs) == 1
    assert sum(name == "celery" and "worker" in args for name, args in programs) >= 1
    assert any(name == "gunicorn" for name, _ in programs)
    if stack.with_locust:
        with urllib.request.urlopen(f"http://127.0.0.1:{stack.locust_port}/", timeout=10) as ui:
            assert ui.status == 200 and b"Locust" in ui.read()
    else:  # the scenarios come with the lab (locustfiles/); until then the UI is left out
        assert "Locust UI off: locustfiles/mixed.py is not in this checkout" in stack.output()


def check_admin_in_a_browser(stack: Stack) -> None:
    """Log in, create an activity, watch its progress move after a grab."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{stack.web}/admin/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "admin")
            page.click("input[type=submit]")
            expect(page.locator("#site-name")).to_contain_text("Django administration")
            page.goto(f"{stack.web}/admin/redpack/activity/add/")
            page.fill("#id_total_amount", "8.88")
            page.fill("#id_total_count", "8")
            page.select_option("#id_strategy", "pessimistic")
            page.click("input[name=_save]")
            activity, row = admin_added_activity(page, "8.88 × 8 (pessimistic)")
            expect(row).to_contain_text("0 / 8")
            code, grab = call(
                "POST", f"{stack.web}/api/activities/{activity}/grab/", None, admin_token(stack)
            )
            assert grab["outcome"] == "grabbed"
            page.reload()
            expect(row).to_contain_text("1 / 8")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "admin.png"), full_page=True)
        finally:
            browser.close()


def check_concurrent_grabs_and_audit(stack: Stack) -> None:
    """40 bench users clicking twice at once on 10 packets, then `manage.py audit`."""
    with (stack.checkout / ".run" / "bench-users.csv").open() as handle:
        tokens = [row["authorization"] for row in csv.DictReader(handle)][:40]
    activity = send(stack, admin_token(stack), amount="10.00", count=10)
    url = f"{stack.web}/api/activities/{activity}/grab/"
    barrier = threading.Barrier(len(tokens) * 2)
    answers: list[tuple[str, int, dict]] = []

    def click(token: str) -> None:
        barrier.wait()
        code, body = call("POST", url, None, token)
        answers.append((token, code, body))

    threads = [threading.Thread(target=click, args=(t,)) for t in tokens for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {code for _, code, _ in answers} <= {200, 409}, answers
    grabbed = [
        (token, Decimal(body["amount"]))
        for token, _, body in answers
        if body["outcome"] == "grabbed"
    ]
    assert len(grabbed) == 10 and len({token for token, _ in grabbed}) == 10
    assert sum(amount for _, amount in grabbed) == Decimal("10.00")
    assert Counter(body["outcome"] for _, _, body in answers)["sold_out"] > 0
    audit = subprocess.run(
        [".venv/bin/python", "manage.py", "audit", "--activity", str(activity)],
        cwd=stack.checkout,
        env=newcomer_env(**stack.run_env()),
        capture_output=True,
        text=True,
    )
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "ok" in audit.stdout


@pytest.fixture
def run_database() -> Iterator[str]:
    """A database of the first run's own on this machine's MariaDB, dropped before and after."""
    db = settings.DATABASES["default"]
    name = f"{db['NAME']}_makerun"
    host, port = db["HOST"] or "127.0.0.1", int(db["PORT"] or 3306)

    def drop() -> None:
        conn = MySQLdb.connect(host=host, port=port, user=db["USER"], password=db["PASSWORD"])
        with conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()

    drop()
    for url in (RUN_REDIS_URL, RUN_BROKER_URL):
        redis.Redis.from_url(url).flushdb()
    yield f"mysql://{db['USER']}:{db['PASSWORD']}@{host}:{port}/{name}"
    drop()


def test_make_run_on_mariadb_and_redis(start, run_database):  # type: ignore[no-untyped-def]
    stack = start(
        newcomer_env(
            DATABASE_URL=run_database,
            REDIS_URL=RUN_REDIS_URL,
            CELERY_BROKER_URL=RUN_BROKER_URL,
            REDPACK_DEMO_ADMIN="on",  # a database of its own: the demo admin is asked for
        )
    )
    stack.wait_for(READY, FIRST_RUN_TIMEOUT)
    output = stack.output()
    assert "database  DATABASE_URL (mysql://" in output and "EMBEDDED MODE" not in output
    assert f"admin     {stack.web}/admin/   (log in as admin / admin)" in output
    check_serving(stack)
    check_admin_in_a_browser(stack)
    stack.interrupt()


def test_make_run_with_mysql_and_redis_unreachable(start):  # type: ignore[no-untyped-def]
    stack = start(
        newcomer_env(
            REDPACK_LOCAL_MYSQL="127.0.0.1:1",
            REDPACK_LOCAL_REDIS="127.0.0.1:1",
            REDPACK_EMBEDDED_REDIS="fakeredis",  # what a machine with only Python gets
        )
    )
    stack.wait_for(READY, FIRST_RUN_TIMEOUT)
    output = stack.output()
    assert "database  embedded SQLite (.run/redpack.sqlite3)" in output
    assert "redis     embedded fakeredis" in output
    assert "(fallback because: no MariaDB/MySQL answers at 127.0.0.1:1)" in output
    assert "numbers measured on this run are not benchmarks" in output
    check_serving(stack)
    check_concurrent_grabs_and_audit(stack)
    stack.interrupt()
