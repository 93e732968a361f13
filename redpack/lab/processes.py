"""The lab's one way to start and stop child processes (servers, load generators, tools).

Each child runs in a session of its own, so stopping it stops everything it started too
(gunicorn's workers, Locust's workers): SIGTERM to the group, then SIGKILL after a grace period.
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

STOP_GRACE_SECONDS = 20.0


class Running:
    """A server the lab started, logging to a file, until `stop()`."""

    def __init__(
        self, name: str, command: list[str], *, env: dict[str, str], cwd: Path, log: Path
    ) -> None:
        self.name = name
        self.log = log
        with open(log, "w") as handle:
            self.process = subprocess.Popen(
                command,
                env=env,
                cwd=cwd,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.psutil = psutil.Process(self.process.pid)  # for its CPU time

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            _stop_group(self.process, STOP_GRACE_SECONDS)


def run(
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    log: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a tool to its end: its output captured (or written to `log`), the whole group killed
    if it outlives `timeout` (then the return code is -SIGKILL and the output what it wrote)."""
    handle = open(log, "w") if log else None  # noqa: SIM115 - closed below
    try:
        process = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdout=handle or subprocess.PIPE,
            stderr=handle or subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_group(process, 0)
            stdout, stderr = process.communicate()
    finally:
        if handle:
            handle.close()
    return subprocess.CompletedProcess(command, process.returncode, stdout or "", stderr or "")


def kill(process: subprocess.Popen) -> None:
    """Kill a child started in a session of its own, with everything it started."""
    _stop_group(process, 0)


def _stop_group(process: subprocess.Popen, grace: float) -> None:
    try:
        if grace > 0:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                pass
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return  # already gone
    process.wait(timeout=10)


# A server's connections that a client opened and the server has not finished with: still
# served, or closed by the client and waiting for the server's close (a burst's wake).
OPEN_STATES = frozenset({psutil.CONN_SYN_RECV, psutil.CONN_ESTABLISHED, psutil.CONN_CLOSE_WAIT})
QUIET_POLL_SECONDS = 0.5  # each look reads every process's sockets


def open_connections(port: int) -> int:
    """Connections to this machine's `port` that the server has not closed yet."""
    return sum(
        1
        for c in psutil.net_connections("tcp")
        if c.laddr and c.laddr.port == port and c.status in OPEN_STATES
    )


def wait_for_quiet(port: int, *, timeout: float) -> float | None:
    """Wait until the server on `port` has closed every connection of the runs before (for
    seconds after a burst of thousands of connections it is still closing them, and a run
    started meanwhile would measure that wake); the seconds waited, or None at the timeout."""
    started = time.monotonic()
    while open_connections(port):
        if time.monotonic() - started >= timeout:
            return None
        time.sleep(QUIET_POLL_SECONDS)  # the server's closes send nothing to wait on
    return time.monotonic() - started
