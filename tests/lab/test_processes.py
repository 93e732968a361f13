"""Starting and stopping child processes (redpack/lab/processes.py), with real processes."""

import socket
import sys

import psutil

from redpack.lab import processes

# A parent that starts a grandchild and then sleeps: stopping the parent must stop both. The
# grandchild is `sleep` (no interpreter to start), so the parent prints its pid at once.
FAMILY = (
    "import subprocess, time;"
    "child = subprocess.Popen(['sleep', '600']);"
    "print(child.pid, flush=True); time.sleep(600)"
)


def test_run_captures_output_and_the_exit_code():
    done = processes.run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"])
    assert (done.returncode, done.stdout.strip()) == (3, "out")


def test_run_kills_the_whole_group_when_it_outlives_its_timeout():
    # Long enough for the parent to start and print even on a loaded machine.
    done = processes.run([sys.executable, "-c", FAMILY], timeout=15)
    assert done.returncode < 0  # killed
    grandchild = int(done.stdout.split()[0])
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == "zombie"


def test_a_running_server_stops_with_everything_it_started(tmp_path):
    server = processes.Running(
        "family", [sys.executable, "-c", FAMILY], env={}, cwd=tmp_path, log=tmp_path / "log"
    )
    children = []
    while not children and server.alive():
        children = server.psutil.children()
    server.stop()
    assert not server.alive()
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive


def test_a_server_is_quiet_once_it_closed_every_connection_its_clients_opened():
    """A connection counts while the server has not closed it, the client's close notwithstanding
    (CLOSE_WAIT: the wake of a burst); the listening socket never counts."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        assert processes.open_connections(port) == 0
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        assert processes.open_connections(port) == 1
        client.close()  # the server's side is half closed now, or about to be
        assert processes.open_connections(port) == 1
        assert processes.wait_for_quiet(port, timeout=0) is None
        accepted.close()
        waited = processes.wait_for_quiet(port, timeout=30)
        assert waited is not None and processes.open_connections(port) == 0
    finally:
        server.close()
