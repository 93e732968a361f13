"""The launcher's choice of backends, the embedded Redis process, SQLite settings.

"Unreachable" is a port nobody listens on (REDPACK_LOCAL_MYSQL=127.0.0.1:1): the machine's
MariaDB and Redis keep running for everybody else.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from django.conf import settings

from redpack import launch

from .servers import ROOT, free_port

CLOSED = "127.0.0.1:1"


def test_nothing_answers_so_everything_is_embedded():
    backends = launch.decide(
        {
            "REDPACK_LOCAL_MYSQL": CLOSED,
            "REDPACK_LOCAL_REDIS": CLOSED,
            "REDPACK_EMBEDDED_REDIS": "fakeredis",
        }
    )
    assert backends.database_url == f"sqlite:///{launch.RUN_DIR}/redpack.sqlite3"
    assert backends.embedded and backends.embedded_redis == "fakeredis"
    port = backends.embedded_redis_port
    assert backends.redis_url == f"redis://127.0.0.1:{port}/0"
    assert backends.broker_url == f"redis://127.0.0.1:{port}/1"
    assert backends.reasons == [
        "no MariaDB/MySQL answers at 127.0.0.1:1",
        "no Redis answers at 127.0.0.1:1",
    ]


def test_embedded_redis_is_a_real_redis_server_when_installed():
    backends = launch.decide({"REDPACK_LOCAL_MYSQL": "off", "REDPACK_LOCAL_REDIS": "off"})
    assert backends.embedded_redis == "redis-server"  # .ci/run installs it
    assert backends.reasons[0] == "local probe off (REDPACK_LOCAL_MYSQL=off)"


def test_local_servers_that_answer_are_used():
    db = settings.DATABASES["default"]
    mysql = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}"
    cache = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).connection_pool
    local_redis = f"{cache.connection_kwargs['host']}:{cache.connection_kwargs['port']}"
    backends = launch.decide({"REDPACK_LOCAL_MYSQL": mysql, "REDPACK_LOCAL_REDIS": local_redis})
    assert backends.database_url == f"mysql://root:@{mysql}/redpack"
    assert backends.redis_url == f"redis://{local_redis}/0"
    assert backends.broker_url == f"redis://{local_redis}/1"
    assert not backends.embedded and backends.reasons == []


def test_urls_from_the_environment_win_without_probing():
    backends = launch.decide(
        {
            "DATABASE_URL": "mysql://u:secret@db.example:3306/x",
            "REDIS_URL": "redis://cache.example:6379/1",
            "REDPACK_LOCAL_MYSQL": CLOSED,
        }
    )
    assert backends.database_url == "mysql://u:secret@db.example:3306/x"
    assert backends.database_note == "DATABASE_URL (mysql://u:***@db.example:3306/x)"
    assert backends.broker_url == "redis://cache.example:6379/2"  # not the packet state's /1
    assert backends.reasons == []
    assert not backends.demo_admin  # never an admin/admin on a database we were pointed at


def test_the_demo_admin_only_on_a_database_make_run_chose():
    assert launch.decide({"REDPACK_LOCAL_MYSQL": CLOSED, "REDPACK_LOCAL_REDIS": "off"}).demo_admin
    configured = {"DATABASE_URL": "mysql://u:p@db.example/x", "REDPACK_LOCAL_REDIS": "off"}
    assert not launch.decide(configured).demo_admin
    assert launch.decide({**configured, "REDPACK_DEMO_ADMIN": "on"}).demo_admin


def wait_for_ping(client: redis.Redis, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            assert process.poll() is None, "the embedded Redis exited"
            assert time.monotonic() < deadline, "the embedded Redis did not answer"
            time.sleep(0.1)


@pytest.mark.parametrize("kind", ["redis-server", "fakeredis"])
def test_embedded_redis_process_runs_lua_and_stops_on_sigterm(kind, tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "REDPACK_EMBEDDED_REDIS": kind,
        "REDPACK_EMBEDDED_REDIS_PORT": str(port),
        "REDPACK_EMBEDDED_REDIS_DIR": str(tmp_path),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "redpack.launch", "redis"], env=env, stdout=subprocess.DEVNULL
    )
    try:
        client = redis.Redis(port=port, db=1)
        wait_for_ping(client, process)
        take = client.register_script(
            "local left = redis.call('DECR', KEYS[1]) if left < 0 then return -1 end return left"
        )
        client.set("rp:{1}:left", 2)
        connection = client.client_id()
        # The first EVALSHA hears NOSCRIPT and loads the script on the same connection.
        assert [take(keys=["rp:{1}:left"]) for _ in range(3)] == [1, 0, -1]
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            client.lpush("rp:{1}:left", 1)
        assert client.client_id() == connection  # errors are replies, not hang-ups
        client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_settings_accept_sqlite_with_immediate_transactions(tmp_path):
    script = (
        "import django, json; django.setup(); from django.conf import settings; "
        "print(json.dumps(settings.DATABASES['default']))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "redpack.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path}/x.sqlite3",
        "SECRET_KEY": "x" * 50,
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    db = json.loads(out.stdout)
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert db["OPTIONS"]["timeout"] > 0
    assert "charset" not in db["OPTIONS"] and "isolation_level" not in db["OPTIONS"]


STOPS_ON_CTRL_C = """
import signal, sys, threading
from redpack.launch import own_terminal_group
stop = threading.Event()
signal.signal(signal.SIGINT, lambda *_: stop.set())
with own_terminal_group():
    print("ready", flush=True)
    stop.wait(60)
print("stopped", flush=True)
"""


def test_ctrl_c_in_a_terminal_reaches_the_stack_and_not_make(tmp_path):
    """`make run` in a terminal: Ctrl-C stops the launcher, which exits 0, and make with it
    (without the terminal's foreground, make would die of the SIGINT: `Error 130`)."""
    import pty
    import select

    (tmp_path / "stack.py").write_text(STOPS_ON_CTRL_C)
    (tmp_path / "Makefile").write_text(f"run:\n\t{sys.executable} stack.py\n")
    pid, terminal = pty.fork()
    if pid == 0:  # the child: a shell on the terminal, as a person's
        os.chdir(tmp_path)
        os.environ["PYTHONPATH"] = str(ROOT)
        os.execvp("bash", ["bash", "-c", "make -s run; echo make-exit=$?"])
    seen = b""

    def read_until(text: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 60
        while text not in seen and time.monotonic() < deadline:
            if select.select([terminal], [], [], 0.5)[0]:
                try:
                    seen += os.read(terminal, 1024)
                except OSError:
                    break

    read_until(b"ready")
    os.write(terminal, b"\x03")  # Ctrl-C: the terminal signals its foreground process group
    read_until(b"make-exit=")
    os.waitpid(pid, 0)
    output = seen.decode(errors="replace")
    assert "stopped" in output and "make-exit=0" in output, output
    assert "Error" not in output and "Interrupt" not in output


def test_flower_starts_only_when_asked_and_the_embedded_redis_first():
    backends = launch.decide({"REDPACK_LOCAL_MYSQL": "off", "REDPACK_LOCAL_REDIS": "off"})
    off, on = argparse.Namespace(flower_port=0), argparse.Namespace(flower_port=5555)
    chosen = launch.chosen_processes(backends, off, with_locust=True)
    assert chosen == ["redis", "web", "worker", "beat", "locust"]
    assert launch.chosen_processes(backends, on, with_locust=False)[-1] == "flower"
