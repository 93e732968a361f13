"""gunicorn's settings wherever redpack's web server runs (`make run`, docker-compose, the lab,
the tests' servers): gunicorn reads this file from the working directory; flags on its command
line (bind, workers, threads) override it.

A hot burst arrives at once: thousands of connections within a millisecond. Connections beyond
what the workers have accepted wait in the kernel's listen queue, and beyond that queue the
kernel drops them, the client resends after 1 s, 3 s, 7 s... (the 9-19 s medians of the
first HTTP comparison). So the queue is as long as the kernel allows (net.core.somaxconn caps
it; 4096 on this machine), and each worker holds up to `worker_connections` connections open
(the threaded worker serves them with its `threads`).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading

backlog = int(os.environ.get("REDPACK_WEB_BACKLOG", "4096"))
worker_connections = int(os.environ.get("REDPACK_WEB_CONNECTIONS", "10000"))
# Seconds an idle kept-alive connection stays open (gunicorn's own default: 2). Longer than a
# proxy's own keep-alive to its upstream (nginx's `keepalive_timeout`: 60 s), which would
# otherwise send a POST on a connection this server had just closed. And a client that keeps
# its connection after its answer (wrk does, and opens a new one at once when the server closes
# it) no longer floods a burst that is still arriving with new connections: at 2 s, some hot
# bursts of 10,000 lost 374-1,201 requests or took 20-60 s (docs/benchmarks.md, "Kept-alive
# connections"). An idle connection costs a descriptor and an entry in the worker's poller; a
# full worker closes its longest idle ones for connections that wait (`webworker._make_room`).
keepalive = int(os.environ.get("REDPACK_WEB_KEEPALIVE", "75"))
# gthread with balanced accepts and a loop whose cost does not grow with what it holds
# (redpack/webworker.py); `--threads` sets its pool as gthread's.
worker_class = os.environ.get("REDPACK_WEB_WORKER_CLASS", "redpack.webworker.BalancedThreadWorker")
# The request's scheme is the app's to judge (settings.SECURE_PROXY_SSL_HEADER: X-Forwarded-Proto,
# and only with HTTPS=1, as deploy/nginx.conf sets it). gunicorn's own default trusts three
# headers from any client on this host (forwarded_allow_ips): the app's links said https:// on a
# plain server, and a proxy on this host that sets X-Forwarded-Proto (nginx) passes a client's
# X-Forwarded-Ssl on. Behind a TLS proxy, set HTTPS=1.
secure_scheme_headers: dict[str, str] = {}
# gunicorn's access line, with the request id the app gave the response (redpack/logs.py).
access_log_format = (
    '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" %({x-request-id}o)s'
)

# /metrics sums this server's workers (prometheus-client's multiprocess mode, redpack/metrics.py):
# every worker writes its counters to files in PROMETHEUS_MULTIPROC_DIR, which must belong to
# this server alone and start empty. Set, it is emptied at start; unset, each server makes a
# fresh directory of its own (removed when it stops). Workers load the app after these hooks ran
# (no preload), so they all see the variable.
_own_metrics_dir: list[str] = []


def on_starting(server):  # type: ignore[no-untyped-def]
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):
            if name.endswith(".db"):
                os.remove(os.path.join(directory, name))
    else:
        directory = tempfile.mkdtemp(prefix="redpack-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        _own_metrics_dir.append(directory)
    # Imported here, once the directory is set (prometheus-client picks its multiprocess values
    # when first imported), and not first in child_exit: a worker that exits while another's
    # exit is importing it (a stop reaps both) would find it half imported.
    import prometheus_client.multiprocess  # noqa: F401

    from redpack import webworker  # noqa: F401  (child_exit's, whatever the worker class)

    hold_what_files_allow(server)
    say_if_the_queue_is_capped(server)
    say_if_mysql_is_short(server)


def on_reload(server):  # type: ignore[no-untyped-def]
    """A reload (SIGHUP) reads this file again into a new config, then forks new workers."""
    hold_what_files_allow(server)
    say_if_the_queue_is_capped(server)


def say_if_mysql_is_short(server):  # type: ignore[no-untyped-def]
    """Each web thread keeps a MySQL connection: a MySQL whose max_connections cannot hold the
    workers' threads beside the connections it holds refuses the ones beyond under load (each
    such request a 503); said at start, with the fix (redpack/checks.py). Asked in a child
    process, started here, before any worker is forked (a worker forked while its pipe was
    being made would hold the pipe open), and read on a thread of its own, so that the start
    does not wait for it: the master never loads the app's settings, so the workers of a
    reload read them anew. Not after a reload, when the old workers still hold their
    connections. Each worker keeps one more, the health probe's (redpack/health.py)."""
    wanted = server.cfg.workers * (server.cfg.threads + 1)
    command = [sys.executable, "-m", "redpack.checks", str(wanted)]
    try:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
    except OSError as exc:
        server.log.debug("MySQL's room for connections not checked: %s", exc)
        return
    reader = threading.Thread(target=mysql_room_said, args=(server, child), daemon=True)
    reader.start()
    return reader  # gunicorn ignores it; a test waits for it


def mysql_room_said(server, child):  # type: ignore[no-untyped-def]
    """What the check in `child` found, said as warnings."""
    try:
        said, _ = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        server.log.debug("MySQL's room for connections not checked in time")
        return
    for line in said.splitlines():
        server.log.warning(line)


def say_if_the_queue_is_capped(server):  # type: ignore[no-untyped-def]
    """The kernel silently shortens a listen queue longer than net.core.somaxconn (128 on
    kernels before 5.4), and a burst beyond the workers' connections and that queue waits for
    its clients to resend (1 s, 3 s, 7 s later): said at start and after a reload, with the fix."""
    from redpack import webworker

    cap = webworker.listen_queue_cap()
    if cap is not None and cap < server.cfg.backlog:
        server.log.warning(
            "listen queue: the kernel caps it at %d, not backlog's %d; a burst beyond it waits"
            " for its clients to resend (sysctl -w net.core.somaxconn=%d)",
            cap,
            server.cfg.backlog,
            server.cfg.backlog,
        )


def hold_what_files_allow(server):  # type: ignore[no-untyped-def]
    """A descriptor per connection, in every worker (they inherit the master's limit): the soft
    limit raised to match worker_connections (webworker.open_files_for); where the hard limit
    allows fewer, a worker holds no more than that, keeping the margin for its own connections
    to MySQL and Redis (a request that cannot open one fails)."""
    from redpack import webworker

    wanted = server.cfg.worker_connections
    holds = webworker.open_files_for(wanted)
    if holds >= wanted:
        return
    server.log.warning(
        "open files: a worker holds at most %d connections, not worker_connections' %d (the"
        " hard limit, ulimit -Hn); the rest of a burst waits in the listen queue",
        holds,
        wanted,
    )
    if holds < server.cfg.threads:
        server.log.error(
            "open files: %d connections per worker is fewer than its %d threads; raise the"
            " hard limit (ulimit -Hn)",
            holds,
            server.cfg.threads,
        )
    server.cfg.set("worker_connections", holds)


def post_worker_init(worker):  # type: ignore[no-untyped-def]
    """The app is loaded (no preload: in each worker): keep it out of the collector's way."""
    from redpack import webworker

    webworker.settle_collector()


def child_exit(server, worker):  # type: ignore[no-untyped-def]
    """A worker that is gone no longer counts in live gauges (its counters stay summed)."""
    from prometheus_client import multiprocess

    from redpack import webworker

    multiprocess.mark_process_dead(worker.pid)
    webworker.release(getattr(worker, "slot", -1))  # a worker of another class has none


def on_exit(server):  # type: ignore[no-untyped-def]
    for directory in _own_metrics_dir:
        shutil.rmtree(directory, ignore_errors=True)
