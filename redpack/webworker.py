"""gunicorn's threaded worker (gthread) with the three changes a hot burst needs.

A hot burst opens thousands of connections within a millisecond. With gunicorn's own gthread
worker, three things made it slow and its end late:

- **Uneven workers.** Every worker polls the one listening socket and accepts whatever is there
  whenever its main thread runs; a connection stays with the worker that accepted it. In a
  burst one worker often took 70% of the connections (measured: 6,623 against 2,702), answered
  them alone while the other sat idle, and the burst ended when the busier one did. Here each
  worker publishes, in memory shared by the server's workers, how many requests it holds (read
  and not yet answered: queued for a thread or running; and connections it accepted whose
  request it has not read yet) and whether its loop can accept (it has booted, is not exiting,
  holds fewer than `worker_connections` connections and is not waiting after an accept() that
  found no descriptor left). It accepts only while it holds no
  more than the least busy of the workers that can accept plus `ACCEPT_SLACK`, or plus a
  quarter of what that one holds when that is less, never less than 2 (`may_accept`);
  the rest of the burst waits in the kernel's listen queue for the others. The least busy
  worker that can accept always polls, so a connection never waits for workers that will not
  take it; a worker that is booting, exiting or full is left out, and a connection that sends
  nothing stops counting after SILENT_SECONDS. A kept-alive connection stays with its worker;
  one that has served a few requests on a worker whose clients kept well more connections busy
  in the last second than another's is answered with `Connection: close`, and comes back to
  the others (`crowded`).
- **One connection per pass.** gthread accepts one connection each time its loop runs, and the
  loop runs when the interpreter lock lets it, behind up to 32 request threads. A burst filled
  the kernel's listen queue (4096 here) faster than that and the kernel dropped the rest; a
  dropped client sends again 1 s, 3 s, 7 s, 15 s later, and the burst ended that much later
  with the server idle (measured: one ping burst of 10,000 took 34 s, most of it idle). Here a
  pass accepts every waiting connection that `may_accept` allows, each counted as it is
  accepted: up to the slack more than the least busy other worker holds (256, measured in
  docs/benchmarks.md, "Accepting a burst"), all that wait when no other worker can accept.
  A long pass (thousands of a burst's requests to read) also gives the listening socket a turn
  every ACCEPT_TURN_SECONDS between its events (`_serve`).
- **A loop that costs more the more it holds.** gthread's main loop asked every pending request
  whether it had finished (`futures.wait` over all of them, a lock each) on every pass: with
  thousands of requests waiting for a thread, each pass cost milliseconds of the interpreter
  lock that the request threads needed. Here a finished request removes itself.

Two smaller differences from gthread: a worker that holds `worker_connections` connections
keeps serving its kept-alive ones (gthread's loop only waited for requests to finish), and one
that is not polling the listening socket looks at the others again every 10 ms; a worker that
is stopping accepts no more, and one out of file descriptors (or memory) leaves the rest of
the queue for later instead of failing. A kept-alive connection whose keep-alive ran out
during a long pass of the loop is served if its next request has come (gthread closed it
unread, and the client was reset: `murder_keepalived`). A request gunicorn itself refuses
(a malformed request line or header, headers too large) is answered in the API's JSON error
shape, naming what was wrong, where gthread wrote an HTML page (`error_answer`). Requests a
client sends without waiting for the answers (HTTP pipelining) are answered in turn, where
gthread answered the first and closed the connection, the rest unanswered, when its keep-alive
ran out (`next_request_read`); and empty lines (CRLF or LF, not a CR alone) before a request
line are passed over, where gunicorn answered 400 (`_Request`). Where a proxy in front could read
a request's bytes otherwise than gunicorn 23 did, the worker refuses them (400, the connection
closed): chunk extensions that are none (`StrictChunkedReader`), a control byte in a header's
value or around a transfer coding (`refused_head`), a tab or a byte past ASCII in the request
line (`_NOT_A_REQUEST_LINE`); it reads every option of Connection (`_Request.should_close`), and
acts on no request whose body was malformed or cut short (`handle_request`). A request arrives
in the loop, and goes to a thread only once all of it is there (`arrival`,
`on_client_socket_readable`): gthread gave a connection to a thread at its first byte, and slow
or partial requests held every thread. Everything else
(keep-alive, graceful shutdown) is gthread's, but a request must arrive in full within
READ_TIMEOUT of its first byte, and a new connection must send one within FIRST_BYTE_TIMEOUT
(gthread waited for both for ever); the kernel hands a connection over only with its first
bytes, or once the handshake has waited READ_TIMEOUT (`defer_accept`). A worker that holds
`worker_connections` while others wait closes its longest idle kept-alive connections, then
those silent for SILENT_EVICT_SECONDS since their accept (`_make_room`).
gunicorn.conf.py makes this the worker class of every redpack web server and frees a worker's
slot when it exits (`release`).
"""

import contextlib
import ctypes
import errno
import gc
import heapq
import inspect
import io
import itertools
import json
import logging
import math
import os
import re
import resource
import select
import selectors
import socket
import ssl
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent import futures
from functools import cached_property, partial
from http import HTTPStatus
from multiprocessing.sharedctypes import RawArray, RawValue
from types import SimpleNamespace
from typing import Any

from gunicorn import http, util
from gunicorn.http import errors as http_errors
from gunicorn.http.body import Body, ChunkedReader, LengthReader
from gunicorn.http.unreader import Unreader
from gunicorn.workers.gthread import TConn, ThreadWorker

from redpack.errors import BODY_CUT_SHORT
from redpack.logs import cut

SLOTS = 64  # workers of one server at once, at most (more accept as gthread's do)
# How many more requests than the least busy worker a worker may hold and still accept (each
# connection a pass of its loop accepts counts at once): at most ACCEPT_SLACK, and while the
# least busy holds little, a quarter of what it holds, at least ACCEPT_SLACK_FLOOR. A burst of
# thousands is split within ACCEPT_SLACK; the few dozen kept-alive connections a pooling client
# opens at once, which then stay with their worker for the whole run, within a quarter (with a
# fixed 256, one worker could take all 64 of a load run's: seen 45 against 19; with a floor of
# 32, all 16 of a smaller one's: seen 15 against 1, the other worker idle).
ACCEPT_SLACK = int(os.environ.get("REDPACK_WEB_ACCEPT_SLACK", "256"))
ACCEPT_SLACK_FLOOR = 2
# A kept-alive connection stays with the worker that accepted it, and a worker that was alone
# in accepting (the others still booting, or restarting) keeps all the connections a client
# opened then (seen: all 16 of a load run's, for the whole run, at half the pings of a split
# server). Each worker counts its busy connections per ACTIVE_SECONDS: those that carried a
# request in that time (one still running counts too), not idle kept-alive ones (a proxy's
# pool), nor requests held at one moment (they swing: counted so, a split server went on
# closing 25-50 connections a second). A worker busier than the least busy one that can accept
# by more than the allowance above (of that one's count) plus REBALANCE_MARGIN, and that holds
# more requests than it may accept with, answers a REBALANCE_AFTER-th request on a connection
# (one without a body, of a client not seen to send a request before an answer) with
# `Connection: close` (`crowded`), at most half the gap per ACTIVE_SECONDS: the client's next
# connection goes to a worker that accepts.
# A burst's connections (one request each) are never closed this way.
REBALANCE_AFTER = 8
REBALANCE_MARGIN = 2
ACTIVE_SECONDS = 1.0
# Idle kept-alive connections, and silent ones, a worker that holds `worker_connections` closes
# per pass of its loop while connections wait in the listen queue (`_make_room`).
EVICT_BATCH = 64
# How long a pass of the loop handles events between two turns of the listening sockets
# (`_serve`): short against the time a burst takes to fill the listen queue (measured in
# docs/benchmarks.md, "Accepting in a long pass"). A turn that finds nobody costs one failed
# accept() per listening socket; a pass shorter than this takes no turn.
ACCEPT_TURN_SECONDS = 0.005
IDLE_POLL_SECONDS = 0.01  # how soon a worker that stopped accepting looks at the others again
# A connection accepted and not yet read counts among what its worker holds (its request is on
# the way) for at most this long: one that sends nothing stops counting, so it cannot steer.
SILENT_SECONDS = 1.0
clock = time.monotonic  # what the loop's times are counted by (tests set it)
# Container objects allocated (net of those freed) between two collections of the youngest
# generation of Python's collector in a web worker (Python 3.11's own: 700); 0 leaves the
# collector as Python sets it. Measured in docs/benchmarks.md ("The collector").
GC_THRESHOLD = int(os.environ.get("REDPACK_WEB_GC_THRESHOLD", "5000"))
# How long a request may take to arrive in full (its head and its body, from its first byte),
# and the most a thread waits to write each part of its answer: a client that stops sending
# mid-request, or sends a byte now and then (slow loris), gets a 408 and loses its connection
# past it (one that sends nothing: FIRST_BYTE_TIMEOUT).
# Requests arrive in the worker's loop (`arrival`); over TLS in a thread, which this limit frees.
# None: no limit (gthread's own).
READ_TIMEOUT = float(os.environ.get("REDPACK_WEB_READ_TIMEOUT", "10")) or None
# How long an accepted connection may wait for its first byte before it is closed as silent.
# Not READ_TIMEOUT: in a burst the kernel hands a connection over without its request once the
# handshake has waited `defer_accept`'s period (its request was dropped each time it came, the
# listen queue full), and by then the client's TCP resends it only after a back-off about as
# long as it has waited already (seen: accepted 15 s after its handshake, its request resent
# 11 s later). Closed at 10 s, such a request was reset when it came, unanswered (up to 1,201
# of a burst of 10,000); 60 s is nginx's `client_header_timeout`. None (0): no limit.
FIRST_BYTE_TIMEOUT = float(os.environ.get("REDPACK_WEB_FIRST_BYTE_TIMEOUT", "60")) or None
# A worker that holds `worker_connections` while connections wait closes, once its idle
# kept-alive ones are gone, those that have sent nothing for this long (`_close_silent`): half
# of FIRST_BYTE_TIMEOUT (30 s; 30 s too with no first-byte limit), past the resend of a request
# the kernel dropped in a burst (about as long after the accept as the handshake waited before
# it: some 16 s with READ_TIMEOUT's deferred accept of about 15 s).
SILENT_EVICT_SECONDS = (FIRST_BYTE_TIMEOUT or 60.0) / 2
# Bytes of empty lines (CRLF or LF) that may come on their own before a request line (_Request).
EMPTY_LINE_BYTES = 64
# A request's head (and a body up to the app's DATA_UPLOAD_MAX_MEMORY_SIZE) arrives in the loop,
# which hands it to a thread only once it is there in full (`arrival`): a head longer than this
# without its end is refused from the loop (431; REDPACK_WEB_HEAD_BYTES, whatever gunicorn's own
# header limits allow), and so is a request line (400, as gunicorn's own limit on it, 4094,
# refuses a shorter one).
HEAD_BYTES = int(os.environ.get("REDPACK_WEB_HEAD_BYTES", str(64 * 1024)))
LINE_BYTES = 8 * 1024
# After an answer that closes a connection whose client may still be sending (a body the app
# refused unread, a request that did not arrive in time), the worker stops writing and reads and
# drops what comes for at most this long before it closes: closed with unread bytes, the kernel
# resets the connection, and the client may lose the answer it has not read yet.
LINGER_SECONDS = float(os.environ.get("REDPACK_WEB_LINGER_SECONDS", "5"))
# accept() errors that say the process or the machine has no room for another connection now.
OUT_OF_ROOM = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
OPEN_FILES_MARGIN = 200  # descriptors a process needs besides one per connection
# After accept() found no room (OUT_OF_ROOM), a worker leaves the listening socket alone this
# long: the connections wait in the listen queue (or for another worker) instead of the loop
# spinning on a socket that stays readable.
NO_ROOM_SECONDS = 0.1

# Created when gunicorn imports the worker class, in its master, so that every worker it forks
# shares them. Per slot: its worker's age (gunicorn numbers the workers it forks; 0: free), the
# requests that worker holds, its busy connections of the last ACTIVE_SECONDS (`_tally`), and 1
# while its loop can accept (`_room`). And the slots in use at most.
_owner = RawArray(ctypes.c_long, SLOTS)
_held = RawArray(ctypes.c_long, SLOTS)
_busy = RawArray(ctypes.c_long, SLOTS)
_ready = RawArray(ctypes.c_long, SLOTS)
_used = RawValue(ctypes.c_long, 0)


def settle_collector(threshold: int = GC_THRESHOLD) -> None:
    """Once a worker has loaded the app: move what it loaded (Django, the URLconf, the
    strategies: over 100,000 objects) out of the collector's reach (`gc.freeze`), and collect
    the youngest generation every `threshold` allocations instead of Python's 700.

    Why: a request that waits (for its batch, for the interpreter lock) outlives two young
    collections, so under load its objects reach the oldest generation, and each collection of
    that generation walked the whole loaded app as well: 70 ms holding the interpreter lock,
    every few seconds per worker, and 7% of a worker's CPU in the collector. A frozen object is
    still freed when its last reference goes; only a reference cycle among frozen objects
    would stay, and what was loaded lives as long as the worker anyway."""
    if threshold <= 0:
        return
    gc.collect()  # what loading left unreachable is freed, not frozen
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(threshold, middle, oldest)


def open_files_for(connections: int) -> int:
    """Raise this process's soft limit of open files (its children inherit it) towards
    `connections` + OPEN_FILES_MARGIN, as far as the hard limit lets a process go without
    privileges; never lower it. Returns how many connections the process can hold now.

    A hot burst needs a descriptor per connection, and many systems start a process at a soft
    limit of 1,024 (a container's too) under a far higher hard one: a worker at 1,024 leaves the
    rest of a 10,000-user burst in the kernel's listen queue, and beyond that queue the kernel
    drops them and the clients resend seconds later. gunicorn.conf.py raises it in the server's
    master, before it forks its workers; the lab, for its load generators."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = connections + OPEN_FILES_MARGIN
    if soft != resource.RLIM_INFINITY and soft < target:
        raised = target if hard == resource.RLIM_INFINITY else min(target, hard)
        # The kernel may refuse what the hard limit seems to allow (a system cap below it,
        # macOS's OPEN_MAX, a sandbox): the limit stays as it was, never a failed start.
        with contextlib.suppress(ValueError, OSError, OverflowError):
            if raised > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
    if soft == resource.RLIM_INFINITY:
        return connections
    return max(1, soft - OPEN_FILES_MARGIN)


SOMAXCONN = "/proc/sys/net/core/somaxconn"  # Linux's cap on any listen queue


def listen_queue_cap() -> int | None:
    """The kernel's cap on a listening socket's queue (Linux), None where it cannot be read."""
    try:
        with open(SOMAXCONN) as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def defer_accept(sock: Any) -> None:
    """Have the kernel hand a TCP listener's connections over only once their first bytes have
    come (Linux's TCP_DEFER_ACCEPT), or READ_TIMEOUT after the handshake without them.

    A connection is closed when it sends nothing within FIRST_BYTE_TIMEOUT of its accept. Without
    this, a connection whose handshake completed while its request's first segment was dropped
    (the listen queue full, in a burst) was accepted on a bare ACK, and its request came only
    when its client sent it again, after a back-off that doubles each time (0.2 s, 0.4 s ...):
    past the deadline the worker closed it as silent, and the request that then arrived was
    reset unanswered. With the connection handed over with its request, the deadline no longer
    runs while the request is on its way in the kernel; and a connection that never sends
    waits in the kernel's handshake queue for that period (READ_TIMEOUT rounded up to the
    SYN-ACK resends: 15 s for 10), then in a worker's loop. The kernel hands one
    over without its bytes once the period is over (the request dropped each time it came, the
    listen queue full all that while), its client then slow to send it again: hence the longer
    FIRST_BYTE_TIMEOUT, not READ_TIMEOUT, after the accept. Not set without READ_TIMEOUT,
    on other families (a Unix socket) or where the kernel lacks it."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if READ_TIMEOUT is None or option is None:
        return
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.IPPROTO_TCP, option, math.ceil(READ_TIMEOUT))


def may_accept(own: int, others: list[int], slack: int) -> bool:
    """Whether a worker holding `own` requests polls the listening socket (and a pass of its
    loop accepts one more), while the other workers that can accept hold `others`: no more than
    the least busy of them plus `slack`, or plus a quarter of what that one holds if that is
    less (never less than ACCEPT_SLACK_FLOOR)."""
    if not others:
        return True
    least = min(others)
    return own <= least + _allowance(least, slack)


def crowded(own: int, others: list[int], slack: int) -> int:
    """How many kept-alive connections a worker with `own` busy ones closes after their
    answers (see REBALANCE_AFTER), to come back to the workers that accept, while the other
    workers that can accept have `others`: as many as it is over the least busy of them past
    that one's allowance (`may_accept`'s) and REBALANCE_MARGIN, at most half the gap between
    the two (each one moved narrows it by two); 0 when it is not over."""
    if not others:
        return 0
    least = min(others)
    over = own - least - _allowance(least, slack) - REBALANCE_MARGIN
    return max(0, min(over, (own - least) // 2))


def _allowance(least: int, slack: int) -> int:
    return min(slack, max(ACCEPT_SLACK_FLOOR, least // 4))


def claim(age: int) -> int:
    """A free slot for a new worker; -1 when none is free. In the master, before the fork (a
    worker's __init__), so no two workers can take the same slot."""
    for slot in range(SLOTS):
        if _owner[slot] == 0:
            _held[slot] = _busy[slot] = 0
            _ready[slot] = 0
            _owner[slot] = age
            _used.value = max(_used.value, slot + 1)
            return slot
    return -1


def release(slot: int) -> None:
    """The worker of `slot` is gone (gunicorn.conf.py's child_exit, in the master): the slot is
    free, and no longer counts among the workers that can accept."""
    if 0 <= slot < SLOTS:
        _ready[slot] = 0
        _held[slot] = _busy[slot] = 0
        _owner[slot] = 0


def _request_waiting(sock: socket.socket) -> bool:
    """Whether the client has sent something on this connection that is not read yet (or closed
    it: the thread that reads it then finds that, and closes it as a readable event would). A
    poll of this one socket (any descriptor number), and for TLS what its buffer holds."""
    pending = getattr(sock, "pending", None)  # ssl.SSLSocket: bytes decrypted, not read yet
    if pending is not None and pending():
        return True
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


# What a request gunicorn could not parse got wrong, named in its JSON answer (`handle_error`):
# the first entry its exception is an instance of. A bad header names itself (`hdr`); an
# unknown transfer coding comes as one (`as_client_error`).
_PARSE_FIELDS: tuple[tuple[type[Exception], str], ...] = (
    (http_errors.LimitRequestLine, "request_line"),
    (http_errors.InvalidRequestLine, "request_line"),
    (http_errors.InvalidRequestMethod, "method"),
    (http_errors.InvalidHTTPVersion, "http_version"),
    (http_errors.InvalidProxyLine, "proxy_line"),
    (http_errors.ForbiddenProxyRequest, "proxy_line"),
    (http_errors.ParseException, "headers"),
)
_ERROR_CODES = {
    400: "bad_request",
    403: "forbidden",
    408: "request_timeout",
    413: "too_large",
    431: "request_headers_too_large",
}
# gunicorn gives a parsed header's name upper-cased; anything else it gives is a raw line.
_HEADER_NAME = re.compile(r"[A-Z0-9-]{1,64}")


class _Kept:
    """Stands in for the client's socket while gunicorn writes its error page
    (util.write_error): keeps the bytes, so that only its status line is used."""

    def __init__(self) -> None:
        self.data = b""

    def gettimeout(self) -> float:
        return 0.0

    def sendall(self, data: bytes) -> None:
        self.data += data


def error_answer(exc: BaseException, status_line: str) -> bytes:
    """The whole HTTP answer to a request gunicorn refused before the app saw it (`status_line`
    gunicorn's, e.g. "HTTP/1.1 431 Request Header Fields Too Large"): the API's JSON error
    shape (redpack/api/errors.py) naming what was wrong, instead of gunicorn's HTML page."""
    from redpack.api.errors import error_body  # the app is loaded by the time a request fails

    try:
        status = int(status_line.split(" ", 2)[1])
    except (IndexError, ValueError):
        status_line, status = "HTTP/1.1 400 Bad Request", 400
    if isinstance(exc, Refused) and exc.status is not None:
        status = exc.status
    with contextlib.suppress(ValueError):  # gunicorn's own line for a status HTTPStatus lacks
        status_line = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"  # gunicorn: 501 Bad Request
    field = None
    if status != 500:
        named = getattr(exc, "hdr", None) if isinstance(exc, http_errors.InvalidHeader) else None
        if isinstance(exc, Refused) and exc.field is not None:
            field = exc.field  # named as it is (a proxy's CGI-style SCRIPT_NAME)
        elif isinstance(named, str) and _HEADER_NAME.fullmatch(named):
            field = named.title()  # a header gunicorn parsed and refused: CONTENT-LENGTH
        else:  # the other parse errors, and a header line with no name to give
            field = next((f for kind, f in _PARSE_FIELDS if isinstance(exc, kind)), None)
    message = cut(str(exc)) if status != 500 else "the server could not answer"
    code = _ERROR_CODES.get(status, "server_error" if status >= 500 else "bad_request")
    body = json.dumps(error_body(code, message, {field: [message]} if field else None)).encode()
    head = (
        f"{status_line}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin1") + body


class ClientRefusals(logging.Filter):
    """gunicorn logs every request it refuses as a WARNING that quotes the client's bytes (up to
    a head's 8 KB): a client sending malformed requests wrote a line per request into the
    server's error log, as loud as the server's own trouble. They are the client's errors, as
    the answer says (400, 431...): at INFO, as nginx logs them, cut as every refusal's line is
    (redpack.logs.cut). So is an answer the client did not read in time, one line without the
    traceback gthread logged it with as an ERROR."""

    PREFIX = "Invalid request from ip="
    # gthread's ERROR, with a traceback, for an answer it could not write within its socket's
    # timeout (READ_TIMEOUT): a client that does not read what it asked for.
    UNREAD = "Socket error processing request."

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == self.UNREAD and record.exc_info and record.exc_info[0] is TimeoutError:
            record.msg = f"a client did not read its answer within {READ_TIMEOUT:g} s: closed"
            record.args, record.exc_info, record.exc_text = (), None, None
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        if record.levelno != logging.WARNING or not str(record.msg).startswith(self.PREFIX):
            return True
        record.msg, record.args = cut(record.getMessage()), ()
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


class Refused(http_errors.InvalidHeader):  # type: ignore[misc]
    """A head gunicorn took that RFC 9112 has a server refuse (`refused_head`), saying why;
    `field`: what its answer names, when not the header `hdr` as headers are named
    (`error_answer`)."""

    def __init__(
        self, hdr: str, why: str, *, field: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(hdr)
        self.why = why
        self.field = field
        self.status = status  # the answer's, when not gunicorn's 400

    def __str__(self) -> str:
        return self.why


# The transfer codings gunicorn 23 takes (before a last chunked; `Message.set_body_reader`).
_GUNICORN_CODINGS = frozenset({"chunked", "identity", "compress", "deflate", "gzip"})
_CHUNKED_LAST = "a request's Transfer-Encoding ends with chunked (or it has none)"
_KNOWN_CODINGS = "a request's Transfer-Encoding is chunked, after gzip, deflate or compress if any"


# A control byte in a header's value (RFC 9110 5.5: visible characters, obs-text, spaces and
# tabs only; gunicorn refuses CR, LF and NUL itself).
_CONTROL_BYTE = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]")


def refused_head(req: Any) -> Refused | None:
    """Why the head of `req`, which gunicorn's parser took, is refused, if it is (RFC 9112):
    an HTTP/1.1 request without a Host, or one with more than one (3.2); a header's value that
    holds a control byte (RFC 9110 5.5; gunicorn took `Transfer-Encoding: \\x0bchunked` as
    chunked, Python's strip() taking the byte for a space, where a proxy may not); a
    Transfer-Encoding whose last coding is not chunked, so that where its body ends cannot be
    known (6.3: gunicorn took `gzip` alone as no body, and what followed as the next request),
    its codings trimmed of spaces and tabs alone (`\\xa0chunked` is no chunked)."""
    hosts = sum(1 for name, _ in req.headers if name == "HOST")
    if hosts > 1 or (hosts == 0 and req.version >= (1, 1)):
        return Refused("HOST", "an HTTP/1.1 request names its host in one Host header")
    for name, value in req.headers:  # most values are printable ASCII: one quick look
        if not value.isprintable() and _CONTROL_BYTE.search(value):
            return Refused(name, "a header's value holds a control byte")
    codings = list(_options(req, "TRANSFER-ENCODING"))
    if codings and codings[-1] != "chunked":
        return Refused("TRANSFER-ENCODING", _CHUNKED_LAST)
    return None


def _options(req: Any, name: str) -> Iterator[str]:
    """The options of every `name` header of `req` (`options`)."""
    for header, value in req.headers:
        if header == name:
            yield from options(value)


def options(value: str) -> list[str]:
    """The options of a header's value (a list: RFC 9110 5.6.1), in lower case, trimmed of
    spaces and tabs alone (Python's strip() takes \\x0b or \\xa0 for a space too)."""
    return [option.strip(" \t").lower() for option in value.split(",")]


def as_client_error(exc: BaseException) -> BaseException:
    """A refusal gunicorn answers with a 5xx that is the client's request's fault, as a 400
    naming what was wrong (the rest as they are):

    - a transfer coding gunicorn does not know (`xchunked`, `chunked;q=1`, an empty one, `br`
      before chunked; gunicorn: 501). Last, or in place of chunked, it leaves the body's end
      unknown, which RFC 9112 6.3 has the server answer 400, as `refused_head` does for `gzip`
      alone; before a last chunked, 6.1 would have 501, but gunicorn names only the one header
      it stopped at (`xfoo` then a second header `chunked` reads as `xfoo` alone), so every such
      request gets the same 400;
    - a path outside SCRIPT_NAME (a header a proxy this server trusts sent, or the server's own
      environment's: gunicorn's ConfigurationProblem, 500 as if the server were misconfigured)."""
    if isinstance(exc, http_errors.UnsupportedTransferCoding):
        value = str(getattr(exc, "hdr", ""))
        return Refused("TRANSFER-ENCODING", f"{_KNOWN_CODINGS}, not {value!r}")
    if isinstance(exc, http_errors.ConfigurationProblem):
        return Refused("SCRIPT_NAME", str(exc.info), field="SCRIPT_NAME")
    return exc


class _Arriving:
    """The client's socket as gunicorn's request parser reads it (its only call is `recv`), with
    a deadline for the request under way: a read that finds nothing by then gives an end of
    stream (gunicorn closes the connection quietly before a head; a body read by the app comes
    out short, which the app answers 400), and the connection is `cut`: out of step, it is not
    kept alive, and the answer says so (Connection: close)."""

    __slots__ = ("sock", "deadline", "cut", "request", "empty_lines")

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.deadline: float | None = None
        self.cut = False
        self.request: Any = None  # gunicorn's request being answered, once its head is read
        self.empty_lines = 0  # bytes of empty lines since the last request line (_Request)

    def start(self) -> None:
        """A request begins to arrive (its first bytes are there)."""
        self.deadline = None if READ_TIMEOUT is None else time.monotonic() + READ_TIMEOUT
        self.cut = False
        self.request = None
        self.sock.settimeout(READ_TIMEOUT)  # for the answer's writes too

    def recv(self, size: int) -> bytes:
        if self.deadline is None:
            return bytes(self.sock.recv(size))
        # Past the deadline, what has come already is still read (without waiting).
        self.sock.settimeout(max(self.deadline - time.monotonic(), 0.0))
        try:
            return bytes(self.sock.recv(size))
        except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
            self.cut = True
            if self.request is not None:
                self.request.must_close = True  # read when the answer's head is written
            return b""
        finally:
            self.sock.settimeout(READ_TIMEOUT)


def next_request_read(parser: Any) -> bool:
    """Whether the client's next request on this connection has been read already, with the
    request just answered (HTTP pipelining). What is left of that request's body (a view need
    not read it) is discarded first, as gunicorn's parser does before the next request, but only
    when all of it has been read: the rest of a body still on its way is left to the loop, which
    waits for the socket. Raises what gunicorn's parser raises for a body it cannot read."""
    body = getattr(parser.mesg, "body", None)
    if body is None or not _body_buffered(parser):
        return False
    while body.read(8192):  # from the buffer alone: no read waits on the socket
        pass
    return bool(_past_empty_lines(parser.unreader.buf.getvalue()))


# Empty lines, and the CR of one whose LF has not come yet (a CRLF split between two reads).
_EMPTY_LINES = re.compile(rb"(?:\r?\n)*(?:\r\Z)?")


def _past_empty_lines(data: bytes) -> bytes:
    """What follows the empty lines (CRLF, or LF alone) `data` begins with: no request begins
    with them. A CR alone is no line's end (RFC 9112 2.2): what follows it is no request, unless
    it is the last byte so far (its LF to come)."""
    if not data.startswith((b"\r", b"\n")):
        return data
    return data[_EMPTY_LINES.match(data).end() :]  # type: ignore[union-attr]


def _body_buffered(parser: Any) -> bool:
    """Whether the rest of the body of the request `parser` read last is in its buffer. Raises
    what gunicorn's parser raises for a malformed chunked body (`_chunks_all_read`)."""
    reader = parser.mesg.body.reader
    if isinstance(reader, LengthReader):
        return bool(reader.length <= _buffered(parser.unreader))
    return isinstance(reader, ChunkedReader) and _chunks_all_read(reader, parser)


def _chunks_all_read(reader: ChunkedReader, parser: Any) -> bool:
    """Whether the rest of a chunked body is in the buffer: it has ended, or it has not begun
    (nobody read it: the app reads no body without a length) and a parse of a copy of what the
    buffer holds reaches its last chunk without running out of bytes (gunicorn's parser takes
    some ends of its bytes for a malformed chunk, or for a body without trailers). Raises what
    that parse raises for a malformed body: where the next request begins is unknown, and the
    connection is closed at once."""
    if reader.parser is None:
        return True
    if inspect.getgeneratorstate(reader.parser) != inspect.GEN_CREATED:
        return False
    copy = _Copy(parser.unreader.buf.getvalue())
    body = StrictChunkedReader(SimpleNamespace(parse_headers=parser.mesg.parse_headers), copy)
    try:
        while body.read(8192):
            pass
    except (http_errors.ParseException, OSError):
        if copy.ran_dry:
            return False  # the rest is on its way
        raise
    return not copy.ran_dry


# What may follow a chunk's size on its line (RFC 9112 7.1.1): extensions, each `;` and a name,
# and `=` and a value (a token or a quoted string) if any, with spaces or tabs around them (and
# after the last, as gunicorn and nginx took them: no proxy ends the line elsewhere for them).
_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_CHUNK_EXTENSIONS = re.compile(
    rb"(?:[ \t]*;[ \t]*%s(?:[ \t]*=[ \t]*(?:%s|%s))?)*[ \t]*" % (_TOKEN, _TOKEN, _QUOTED)
)


def chunk_line_ok(line: bytes) -> bool:
    """Whether `line` (without its CRLF) is a chunk's size line as RFC 9112 7.1.1 writes it: hex
    digits, then extensions, each `;` and a token name, with `=` and a token or quoted-string
    value if any, spaces or tabs around them."""
    semicolon = line.find(b";")
    size = line if semicolon < 0 else line[:semicolon].rstrip(b" \t")
    if not _CHUNK_SIZE.fullmatch(size):
        return False
    return semicolon < 0 or _CHUNK_EXTENSIONS.fullmatch(line, len(size)) is not None


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]+")
CHUNKS_CUT_SHORT = "the request's chunked body ended before its last chunk and trailers"


class StrictChunkedReader(ChunkedReader):  # type: ignore[misc]
    """gunicorn's chunked body reader, with each chunk's line checked (`chunk_line_ok`): gunicorn
    read anything between the size and the CRLF as extensions, a bare LF, a NUL or an unended
    quote included. A proxy that ends the line at the LF (or at the quote's end) sees other
    chunks than this server: a body that hides a second request from one of them. Such a line is
    InvalidChunkSize, as a bad size is."""

    def parse_chunk_size(self, unreader: Any, data: bytes | None = None) -> Any:
        buf = io.BytesIO()
        if data is not None:
            buf.write(data)
        while (line_end := buf.getvalue().find(b"\r\n")) < 0:
            self.get_data(unreader, buf)  # NoMoreData at the end of the stream, as gunicorn's
        line = buf.getvalue()[:line_end]
        if not chunk_line_ok(line):
            raise http_errors.InvalidChunkSize(line[:40])
        return super().parse_chunk_size(unreader, buf.getvalue())


class ChunkWalk:
    """The loop's walk over a chunked body as it arrives (RFC 9112 7.1), from `start` in the
    bytes of its request: where the first chunk line not yet whole begins (`at`), and how far
    the search for its end has gone. Each chunk's data is stepped over, and a line is searched
    once: a piece of a body sent in pieces costs the loop its own bytes, not the body's so far.
    Each line and each chunk's CRLF is judged as soon as gunicorn's parser would judge it (a
    line once it has ended): one that is wrong hands the request over, and the thread's parse
    (`_chunks_all_read`, `StrictChunkedReader`) refuses it, before any view."""

    def __init__(self, start: int, most: int) -> None:
        self.start = self.at = self.searched = start
        self.most = most  # the body's bytes past which the loop waits no longer
        self.last = False  # the last chunk's line has come: trailers to come, then an empty line

    def to_come(self, data: bytes) -> int:
        """How long `data` must grow before the body may have ended; 0 when the request is to go
        to a thread now: its last chunk and trailers are there, or a line or a chunk's CRLF is
        wrong (the thread's parse refuses it, 400), or the body runs past `most` bytes or a line
        past LINE_BYTES (the thread refuses it unread, 413, `handle_request`)."""
        while True:
            if self.at > len(data):  # a chunk's data, and its CRLF, still to come
                return self.at
            if self.at > self.start and not self.last and data[self.at - 2 : self.at] != b"\r\n":
                return 0  # the chunk's data runs on past its size
            if self.last and data.startswith(b"\r\n", self.at):
                return 0
            end = b"\r\n\r\n" if self.last else b"\r\n"
            found = data.find(end, max(self.at, self.searched), self.at + LINE_BYTES)
            if found < 0:
                if len(data) - self.at >= LINE_BYTES:
                    return 0
                self.searched = max(self.at, len(data) - len(end) + 1)  # an end split in two
                return len(data) + 1
            line = data[self.at : found]
            if self.last or not chunk_line_ok(line):
                return 0
            size = int(line.split(b";", 1)[0].rstrip(b" \t"), 16)
            self.at = self.searched = found + 2
            if size == 0:
                self.last = True
                continue
            self.at = self.searched = self.at + size + 2  # its data and CRLF
            if self.at - self.start > self.most:
                return 0


class Arrival:
    """What the loop makes of the bytes of a request that has begun to arrive (`arrival`)."""

    WAIT = "wait"  # not all there yet: the connection stays in the loop
    READY = "ready"  # in full, or for gunicorn's parser to refuse: to a thread
    INVALID = "invalid"  # no HTTP request, or a head too long: refused from the loop (`refusal`)


# A request line is visible ASCII and spaces, ended by CRLF: a control byte (a bare LF, NUL, a TLS
# ClientHello's 0x16) says the bytes are no HTTP/1 request, and none will end its head; a tab or
# a byte past ASCII is no part of a request target (RFC 9112 3.2, 3.3: Python's urlsplit dropped
# a tab, `/heal\tthz` was /healthz, and a UTF-8 path reached the app as Latin-1 re-encoded).
_NOT_A_REQUEST_LINE = re.compile(rb"[\x00-\x1f\x7f-\xff]")


_LATER_THAN_1_0 = re.compile(rb" HTTP/1\.[1-9]\Z")  # a request line's end: 1.1 and the 1.x after


def _ended_by_lf(rest: bytes, fresh: int | None) -> bool:
    """Whether the head `rest` begins, without its CRLF CRLF, has ended all the same: an empty
    line after a line ended by LF alone (RFC 9112 2.2: lines end with CRLF). Only its last
    `fresh` bytes and the two before them are searched (an end in the earlier ones was found
    when they came): a slow client's every byte costs the loop a search of what it sent since,
    not of its whole head."""
    start = 0 if fresh is None else max(0, len(rest) - fresh - 2)
    return (
        rest.find(b"\n\n", start, HEAD_BYTES) >= 0 or rest.find(b"\n\r\n", start, HEAD_BYTES) >= 0
    )


def _request_line(rest: bytes) -> tuple[bytes, int]:
    """The request line `rest` begins with, as far as it has come (at most LINE_BYTES), and where
    it ends (-1: not yet)."""
    line_end = rest.find(b"\r\n", 0, LINE_BYTES)
    return (rest[:line_end] if line_end >= 0 else rest[:LINE_BYTES].removesuffix(b"\r")), line_end


def arrival(
    data: bytes, *, body_bytes: int, fresh: int | None = None
) -> tuple[str, bool, int, ChunkWalk | None]:
    """Whether the request whose bytes so far are `data` has arrived: its head, and its body
    when that has a Content-Length of at most `body_bytes` (a longer one is the app's to refuse,
    413), or is chunked (its last transfer coding, on HTTP/1.1 or a later 1.x) and ends within
    `body_bytes` (a longer one the thread refuses, 413, `handle_request`). Second: whether the
    client waits for a 100 Continue before it sends that body (HTTP/1.1 or a later 1.x, `Expect:
    100-continue`, the body not all there). Third, when waiting for a body: how many bytes
    `data` must hold before anything changes (the head is not parsed again for every piece of a
    body sent in pieces); else 0. Fourth, for a chunked body still to come: the walk over its
    chunks, which goes on from where it stopped as the rest comes (`ChunkWalk.to_come`); else
    None.

    Anything odd in a head that has ended (folded lines, a header without a colon, two
    Content-Lengths, a Transfer-Encoding other than chunked alone) goes to a thread as it is:
    gunicorn's parser refuses it, or takes it and `refused_head` may.
    Bytes that begin no request, a request line past LINE_BYTES or without a version (HTTP/0.9),
    a head ended after a line ended by LF alone (its CRLF CRLF would never come: gthread held a
    thread on it until the request deadline, the loop waited as long and answered 408) and a
    head past HEAD_BYTES are INVALID (`refusal`). `fresh`: how many of the last bytes of `data`
    came since the last look at it (None: all), where such an end is looked for."""
    rest = _past_empty_lines(data)
    if not rest:
        return (Arrival.READY if len(data) > EMPTY_LINE_BYTES else Arrival.WAIT), False, 0, None
    line, line_end = _request_line(rest)
    if _NOT_A_REQUEST_LINE.search(line):
        return Arrival.INVALID, False, 0, None
    if line_end < 0:
        return (Arrival.INVALID if len(rest) > LINE_BYTES else Arrival.WAIT), False, 0, None
    if _no_version(line):
        return Arrival.INVALID, False, 0, None
    head_end = rest.find(b"\r\n\r\n", 0, HEAD_BYTES)
    if head_end < 0:
        stuck = len(rest) >= HEAD_BYTES or _ended_by_lf(rest, fresh)
        return (Arrival.INVALID if stuck else Arrival.WAIT), False, 0, None
    lines = rest[:head_end].split(b"\r\n")
    lengths: list[bytes] = []
    codings: list[str] = []
    expect = False
    for header in lines[1:]:
        name, colon, value = header.partition(b":")
        if not colon or name != name.strip() or header[:1] in b" \t":
            return Arrival.READY, False, 0, None
        name, value = name.lower(), value.strip()
        if name == b"content-length":
            lengths.append(value)
        elif name == b"transfer-encoding":
            codings += options(value.decode("latin-1"))
        elif name == b"expect":
            expect = value.lower() == b"100-continue"
    later = _LATER_THAN_1_0.search(lines[0]) is not None  # Expect and chunked: 1.1 and later
    expect = expect and later
    body_starts = len(data) - len(rest) + head_end + 4
    # Chunked last and once, after codings gunicorn knows (else it refuses the head at once).
    chunked = codings[-1:] == ["chunked"] and codings.count("chunked") == 1
    if chunked and later and not lengths and _GUNICORN_CODINGS.issuperset(codings):
        walk = ChunkWalk(body_starts, body_bytes)
        complete_at = walk.to_come(data)
        if complete_at:
            return Arrival.WAIT, expect, complete_at, walk
        return Arrival.READY, False, 0, None
    if codings or len(lengths) != 1 or not lengths[0].isdigit():
        return Arrival.READY, False, 0, None
    length = int(lengths[0])
    if length > body_bytes or len(data) - body_starts >= length:
        return Arrival.READY, False, 0, None
    return Arrival.WAIT, expect, body_starts + length, None


class _Copy(Unreader):  # type: ignore[misc]
    """Bytes to parse, as gunicorn's parser reads a socket; past them, the end of the stream,
    and `ran_dry` says so."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data: bytes | None = data
        self.ran_dry = False

    def chunk(self) -> bytes:
        data, self.data = self.data, None
        if not data:
            self.ran_dry = True
            return b""
        return data


def refusal(data: bytes) -> http_errors.ParseException:
    """Why the loop refuses the request whose bytes so far are `data` (Arrival.INVALID), as
    gunicorn's parser would say it (`handle_error` answers it): bytes that begin no HTTP request,
    a request line longer than LINE_BYTES or without a version, a head ended after a line
    ended by LF alone, or a head longer than HEAD_BYTES."""
    rest = _past_empty_lines(data)
    line, line_end = _request_line(rest)
    if _NOT_A_REQUEST_LINE.search(line):
        return http_errors.InvalidRequestLine(rest[:40].decode("latin1"))
    if line_end < 0:
        return http_errors.LimitRequestLine(len(rest), LINE_BYTES)
    if _no_version(line):
        return http_errors.InvalidRequestLine(line[:40].decode("latin1"))
    if _ended_by_lf(rest, None):
        return Refused("", "a line of the request's head ends with LF alone, not CRLF")
    return http_errors.LimitRequestHeaders(f"the request's head is longer than {HEAD_BYTES} bytes")


def _no_version(line: bytes) -> bool:
    """Whether a whole request line lacks the three parts of an HTTP/1 one (method, target and
    version, RFC 9112 3): an HTTP/0.9 `GET /`, whose client sends no head after it."""
    return line.count(b" ") < 2


def _asks_head(data: bytes) -> bool:
    """Whether the request whose bytes begin `data` is a HEAD: its answer has no body."""
    return _past_empty_lines(data).startswith(b"HEAD ")


def _without_body(answer: bytes) -> bytes:
    """An answer's status line and headers alone (RFC 9110 9.3.2), for a HEAD request."""
    return answer.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"


def _continue(conn: Any) -> None:
    """Send the 100 Continue the request under way asks for (`_Conn.continued`); a small write,
    whether the socket blocks (a thread's) or not (the loop's)."""
    conn.continued = True
    with contextlib.suppress(OSError):
        conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")


def _timed_out() -> bytes:
    """The 408 to a request that did not arrive in full within READ_TIMEOUT."""
    message = f"the request did not arrive in full within {READ_TIMEOUT:g} s"
    return error_answer(TimeoutError(message), "HTTP/1.1 408 Request Timeout")


def _buffered(unreader: Any) -> int:
    unreader.buf.seek(0, os.SEEK_END)  # where gunicorn's reads put it too
    return int(unreader.buf.tell())


class _Request(http.Request):  # type: ignore[misc]
    """gunicorn's request, which first passes over empty lines sent before its request line (a
    client that ends a body with an extra CRLF): RFC 9112 2.2 asks a server to, where gunicorn
    answered 400 and closed the connection. A read that brings empty lines alone ends the
    attempt (`_Arriving.empty_lines` counts them; StopIteration, as at a connection's end, and
    `BalancedThreadWorker.handle` puts the connection back in the loop to wait for its request:
    a thread never waits for one). Once such reads bring more than EMPTY_LINE_BYTES in all,
    gunicorn's 400: a client cannot keep a connection with empty lines alone. Its chunked body
    is read by StrictChunkedReader, and its Connection header as a list (`should_close`)."""

    def parse(self, unreader: Any) -> Any:
        arriving = unreader.sock
        data = unreader.read()  # what is buffered, else one read: the socket is readable
        rest = _past_empty_lines(data)
        if data and not rest and arriving.empty_lines + len(data) <= EMPTY_LINE_BYTES:
            arriving.empty_lines += len(data)
            raise StopIteration("empty lines only")
        arriving.empty_lines = 0
        unreader.unread(rest if rest else data)
        return super().parse(unreader)

    def set_body_reader(self) -> None:
        super().set_body_reader()
        if isinstance(self.body.reader, ChunkedReader):  # type: ignore[has-type]
            self.body = Body(StrictChunkedReader(self, self.unreader))

    def should_close(self) -> bool:
        """gunicorn's, reading every option of every Connection header (RFC 9110 7.6.1: a
        list): gunicorn read the first header's value whole, and `keep-alive, close` or a
        second header's `close` kept the connection open."""
        if self.must_close:
            return True
        kept = False
        for option in _options(self, "CONNECTION"):
            if option == "close":
                return True
            kept = kept or option == "keep-alive"
        return not kept and bool(self.version <= (1, 0))


class _RequestParser(http.RequestParser):  # type: ignore[misc]
    mesg_class = _Request


class _Deadlines:
    """Connections waiting in the loop, by deadline; added from any thread. An entry counts
    while its connection's `waits` is what it was when added (`_Conn`): one that moved on since
    (to a thread, to another wait) is passed over. An entry holds its connection weakly: a
    connection closed long before its entry's deadline (a request's first bytes come within
    milliseconds, FIRST_BYTE_TIMEOUT is a minute) is freed once nothing else holds it, not kept
    for that minute by its entry."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, weakref.ref[Any], int]] = []
        self._lock = threading.Lock()
        self._order = itertools.count()

    def add(self, deadline: float, conn: Any) -> None:
        with self._lock:
            heapq.heappush(self._heap, (deadline, next(self._order), weakref.ref(conn), conn.waits))

    def first(self) -> float | None:
        """The earliest deadline held (perhaps of a connection that has moved on since)."""
        with self._lock:
            return self._heap[0][0] if self._heap else None

    def past(self, now: float) -> Iterator[Any]:
        """Take out, and yield, the connections whose deadline is past and who still wait."""
        while True:
            with self._lock:
                if not self._heap or self._heap[0][0] > now:
                    return
                _, _, ref, waits = heapq.heappop(self._heap)
            conn = _still_waiting(ref, waits)
            if conn is not None:
                yield conn


def _still_waiting(ref: weakref.ref[Any], waits: int) -> Any:
    """The connection an entry made when its `waits` was `waits` holds weakly, if it is still
    there and has not moved on since (`_Conn.waits`); else None."""
    conn = ref()
    return conn if conn is not None and conn.waits == waits else None


class _Conn(TConn):  # type: ignore[misc]
    """gthread's connection, its parser reading through `_Arriving`."""

    arriving: _Arriving
    pipelined = False  # its next request was read with the last one (`next_request_read`)
    early = b""  # what the loop read of the request under way, not yet its parser's
    waits = 0  # bumped whenever it starts or stops waiting in the loop (`_wait`)
    complete_at = 0  # the length of `early` at which its request's body will be there
    walk: ChunkWalk | None = None  # how far the loop is in its request's chunked body
    continued = False  # the loop sent its request's 100 Continue
    linger = False  # closed after its answer: its client may still be sending (`_linger`)
    served = 0  # requests read on it, this one too (`_rebalanced`)
    counted = -1  # the last ACTIVE_SECONDS period it was counted busy in (`_tally`)
    # It sent a request before the answer to the one before: never closed to move it, which
    # could leave such a request unanswered (`_rebalanced`).
    pipelines = False
    # Its client shut down its side: nothing more will come (never reset: nor will it later).
    ended = False

    def init(self) -> None:
        fresh = self.parser is None  # type: ignore[has-type]
        super().init()  # wraps the socket for TLS and makes a parser the first time
        if fresh:
            self.arriving = _Arriving(self.sock)
            self.parser = _RequestParser(self.cfg, self.arriving, self.client)


_client_refusals = ClientRefusals()


class BalancedThreadWorker(ThreadWorker):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slot = claim(self.age)  # in the master
        logging.getLogger("gunicorn.error").addFilter(_client_refusals)  # once: the same filter
        # The requests this worker holds: read, queued for a thread or running, not answered;
        # and the connections accepted whose request is not read yet (SILENT_SECONDS at most;
        # the loop's thread alone touches them), oldest first in `_unread_since`.
        self._pending: set[futures.Future[Any]] = set()
        self._pending_lock = threading.Lock()
        self._unread: set[Any] = set()
        self._unread_since: deque[tuple[float, Any]] = deque()
        # The connections accepted, oldest first, as (accepted at, connection held weakly, its
        # `waits` then): while `waits` is unchanged it has sent nothing (`_close_silent`).
        self._accepted: deque[tuple[float, weakref.ref[Any], int]] = deque()
        self._listening = False
        self._no_room_until: float | None = None  # set while accept() finds no room
        # Busy connections (`_tally`): of the period under way (`_period`), of the last one
        # (`_busy`, published), and connections closed to move them in this one (`_moved`).
        self._period = -1
        self._busy_now = self._busy = self._moved = 0
        # Requests arrive in the loop (`arrival`), not in a thread; not over TLS, whose
        # handshake gthread makes in the thread that reads the first request.
        self._gathers = not self.cfg.is_ssl
        self._waits = _Deadlines()  # of the connections waiting in the loop
        # Per thread: whether the request it answers began with HEAD (`handle_error`).
        self._answering = threading.local()

    def handle(self, conn: Any) -> Any:
        """gthread's, with a limit on how long the request may take to arrive (READ_TIMEOUT,
        `_Arriving`): a connection whose request was cut short is closed after its answer, not
        kept alive out of step (the rest of a body would be read as the next request). A kept
        connection whose next request was read with this one (`next_request_read`) is served
        again at once (`finish_request`)."""
        conn.arriving.start()
        self._answering.head = _asks_head(conn.early or conn.parser.unreader.buf.getvalue())
        if conn.early:  # what the loop read: the request, in full (`arrival`)
            conn.parser.unreader.unread(conn.early)
            conn.early = b""
        keepalive, conn = super().handle(conn)
        if conn.arriving.request is None and conn.arriving.empty_lines and not conn.arriving.cut:
            conn.pipelined = False
            return True, conn  # empty lines alone: back to the loop, to wait for the request
        keepalive = keepalive and not conn.arriving.cut
        try:  # reads the buffer alone: no read that could cut the connection
            conn.pipelined = keepalive and next_request_read(conn.parser)
        except (http_errors.ParseException, OSError):  # out of step: closed, never read on
            return False, conn
        conn.pipelines = conn.pipelines or conn.pipelined
        if conn.pipelined and self._gathers:
            return self._next_in_buffer(conn), conn
        return keepalive, conn

    def _next_in_buffer(self, conn: Any) -> bool:
        """The next request came with the last one: served at once when all of it is there;
        else back to the loop, its start taken out of the parser's buffer, to arrive there like
        any request; refused when it is no request at all."""
        unreader = conn.parser.unreader
        buffered = unreader.buf.getvalue()
        verdict, expect, complete_at, walk = arrival(buffered, body_bytes=self._body_bytes)
        if verdict == Arrival.READY:
            return True
        conn.pipelined = False
        unreader.buf = io.BytesIO()
        if verdict == Arrival.WAIT:
            conn.early, conn.complete_at, conn.walk = buffered, complete_at, walk
            if expect:  # its client waits for it before the body
                _continue(conn)
            return True
        self._refuse(conn, buffered)
        conn.linger = True
        return False

    def _refuse(self, conn: Any, data: bytes) -> None:
        """Answer the request whose bytes so far are `data`, which the loop refuses
        (Arrival.INVALID), as gunicorn answers a request its parser refuses (`handle_error`)."""
        self._answering.head = _asks_head(data)
        self.handle_error(None, conn.sock, conn.client, refusal(data))

    def handle_request(self, req: Any, conn: Any) -> Any:
        conn.arriving.request = req  # a body cut short closes the connection after its answer
        refused = refused_head(req)
        if refused is not None:  # answered 400 (gthread's handle: handle_error), then closed
            conn.linger = self._gathers
            raise refused
        # A later HTTP/1.x is answered as the 1.1 this server speaks (RFC 9110 2.5), where
        # gunicorn echoed the request's version in its status line.
        req.version = min(req.version, (1, 1))
        # gunicorn sends 100 Continue to a request that asks for it, before the app runs; not to
        # an HTTP/1.0 client, which knows none (RFC 9110 10.1.1: ignored) and could take it for
        # its answer; not again after the loop's; not for a body the app will refuse unread.
        continued, conn.continued = conn.continued, False
        expect = req.version < (1, 1) or continued
        read = True  # all of its body read with its head
        conn.served += 1
        if conn.counted != self._period:
            conn.counted = self._period
            self._busy_now += 1  # unlocked: a count off by one now and then
        if self._gathers:
            try:
                read = _body_buffered(conn.parser)
            except (http_errors.ParseException, OSError) as exc:  # never acted on
                conn.linger = True
                raise Refused("", "the request's chunked body is malformed", field="body") from exc
            reader = conn.parser.mesg.body.reader
            if not read and conn.ended:
                # Its client shut down its side before all of the body came (the loop waits
                # for a body, and hands it over then): never acted on either, where the grab and
                # the ping, which read no body, ran as if it were whole.
                if isinstance(reader, LengthReader):
                    raise Refused("CONTENT-LENGTH", BODY_CUT_SHORT.format(reader.length))
                raise Refused("", CHUNKS_CUT_SHORT, field="body")
            if not read and isinstance(reader, ChunkedReader):
                # Past what the loop waits for (`ChunkWalk`): its end unseen, whether its chunks
                # are whole or hide a request is unknown, and no view reads it (411, or the grab
                # and the ping, which read none): refused unread, never acted on.
                conn.linger = True
                raise Refused("", self._chunks_too_long, field="body", status=413)
        if not read:
            # A Content-Length longer than the loop reads (`arrival`): the app refuses it unread
            # (413), and the connection closes after the answer, lingering for what is still
            # sent.
            req.must_close = conn.linger = expect = True
        elif req.method == "CONNECT":
            # Refused (405: no proxy here), and closed after the answer: a client may send its
            # tunnel's bytes without waiting for it, which are no requests to answer.
            req.must_close = conn.linger = True
        elif self._rebalanced(conn):
            req.must_close = conn.linger = True
        if expect:
            req.headers = [(name, value) for name, value in req.headers if name != "EXPECT"]
        return super().handle_request(req, conn)

    def _rebalanced(self, conn: Any) -> bool:
        """Whether this answer closes its kept-alive connection to move it to a less busy
        worker (`crowded`: at most as many per period as it says): asked at every
        REBALANCE_AFTER-th answer on it, only for a request without a body, of a worker that is
        not stopping and would not take the client's next connection itself (`may_accept`), and
        only on a connection whose client has not been seen to send a request before the answer
        to the one before (a request that came meanwhile would go unanswered)."""
        if conn.served % REBALANCE_AFTER or conn.pipelines or not self.alive:
            return False
        reader = conn.parser.mesg.body.reader
        if not isinstance(reader, LengthReader) or reader.length:
            return False
        if _past_empty_lines(conn.parser.unreader.buf.getvalue()) or _request_waiting(conn.sock):
            conn.pipelines = True  # its next request came before this answer
            return False
        if may_accept(self._holds(), self._others(), ACCEPT_SLACK):
            return False  # its client's next connection could come back here
        if self._moved >= crowded(self._busy, self._others(_busy), ACCEPT_SLACK):
            return False
        self._moved += 1
        return True

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """gunicorn's handling of a request it could not parse (or an error past the app):
        its status, its log and access log line, but the answer in JSON (`error_answer`)."""
        kept = _Kept()
        exc = as_client_error(exc)
        super().handle_error(req, kept, addr, exc)
        try:
            answer = error_answer(exc, kept.data.split(b"\r\n", 1)[0].decode("latin1"))
        except Exception:  # noqa: BLE001 - gunicorn's own page rather than no answer
            self.log.exception("Could not answer a refused request in JSON")
            answer = kept.data
        # A HEAD gets the status and headers alone, as the app answers it: known from the
        # request, or, when the parser refused it before there was one, from its first bytes.
        parsed = getattr(req or getattr(exc, "req", None), "method", None)
        if parsed == "HEAD" or (parsed is None and getattr(self._answering, "head", False)):
            answer = _without_body(answer)
        try:
            util.write_nonblock(client, answer)
        except Exception:  # noqa: BLE001 - as gunicorn: the client may be gone
            self.log.debug("Failed to send error message.")

    # --- what this worker holds ----------------------------------------------------------

    def _holds(self) -> int:
        return len(self._pending) + len(self._unread)

    def _publish_held(self) -> None:  # under _pending_lock, or in the loop's thread
        if self.slot >= 0:
            _held[self.slot] = self._holds()

    def _unread_change(self, conn: Any, accepted: bool) -> None:
        if accepted:
            self._unread.add(conn)
            self._unread_since.append((clock(), conn))
        elif conn in self._unread:
            self._unread.discard(conn)
        else:
            return
        self._publish_held()  # no lock: the next publish corrects a count written in between

    def _forget_silent(self) -> None:
        """Connections accepted more than SILENT_SECONDS ago and still unread no longer count."""
        since = clock() - SILENT_SECONDS
        while self._unread_since and self._unread_since[0][0] < since:
            self._unread_change(self._unread_since.popleft()[1], accepted=False)

    def _ready_to_accept(self, ready: bool) -> None:
        if self.slot >= 0:
            _ready[self.slot] = int(ready)

    def _tally(self) -> None:
        """At the first pass of the loop in each ACTIVE_SECONDS period: publish the busy
        connections of the period that ended (those that carried a request in it, and those
        whose request still runs; less those closed to move them), and start the next one. A
        loop that slept past a period's end counts it from its last pass (at most a second and
        a bit more)."""
        period = int(clock() // ACTIVE_SECONDS)
        if period == self._period:
            return
        ended = self._period
        with self._pending_lock:
            running = [fs.conn for fs in self._pending]  # type: ignore[attr-defined]
        busy = self._busy_now + sum(1 for conn in running if conn.counted != ended)
        self._busy = max(0, busy - self._moved)  # those moved are busy elsewhere now
        self._busy_now = self._moved = 0
        self._period = period
        if self.slot >= 0:
            _busy[self.slot] = self._busy

    def _room(self) -> bool:
        """Whether this worker may take another connection: it holds fewer than
        `worker_connections`, and the last accept() that found no room is NO_ROOM_SECONDS old."""
        if self._no_room_until is not None and clock() < self._no_room_until:
            return False
        return bool(self.nr_conns < self.worker_connections)

    def _others(self, counts: Any = _held) -> list[int]:
        """What the other workers that can accept hold: requests (`_held`), or busy
        connections (`_busy`)."""
        me = self.slot
        return [counts[s] for s in range(_used.value) if s != me and _ready[s]]

    def _wrap_future(self, fs: futures.Future[Any], conn: Any) -> None:
        fs.conn = conn  # type: ignore[attr-defined]
        with self._pending_lock:
            self._pending.add(fs)
            self._publish_held()
        fs.add_done_callback(self.finish_request)

    def finish_request(self, fs: futures.Future[Any]) -> None:
        """gthread's; but a kept-alive connection whose next request has been read already
        (HTTP pipelining: the client sent it without waiting for this answer) goes back to the
        threads at once. Left to the loop, it would wait for its socket to become readable, which
        it never does: its next request is in the parser's buffer, not the socket's, and gthread
        closed it unanswered when its keep-alive ran out."""
        try:
            if not (self._serve_next(fs) or self._rest_to_come(fs)):
                super().finish_request(fs)
        finally:
            with self._pending_lock:
                self._pending.discard(fs)
                self._publish_held()

    def _rest_to_come(self, fs: futures.Future[Any]) -> bool:
        """A connection whose next request has begun to come (`_next_in_buffer`) waits for the
        rest in the loop; one closed while its client may still be sending lingers."""
        if fs.cancelled() or fs.exception() is not None:
            return False
        keepalive, conn = fs.result()
        if keepalive and self.alive and conn.early:
            conn.sock.setblocking(False)
            # Its deadline before the loop can see it: the loop may close it at once.
            self._wait(conn, READ_TIMEOUT)
            with self._lock:
                self.poller.register(
                    conn.sock, selectors.EVENT_READ, partial(self.on_client_socket_readable, conn)
                )
            return True
        if not keepalive and conn.linger:
            conn.linger = False
            self._linger(conn)
            return True
        return False

    def _serve_next(self, fs: futures.Future[Any]) -> bool:
        if fs.cancelled() or fs.exception() is not None:
            return False
        keepalive, conn = fs.result()
        if not (keepalive and self.alive and getattr(conn, "pipelined", False)):
            return False
        try:
            self.enqueue_req(conn)
        except RuntimeError:  # the threads are shutting down: closed, as gthread's would be
            return False
        return True

    def accept(self, server: Any, listener: Any) -> None:
        """Every waiting connection `may_accept` allows, where gthread takes one per pass of
        its loop (see the module's docstring)."""
        others = self._others()
        # Not once stopping: what it took now would be closed unanswered, and in the listen
        # queue it waits for the other workers.
        while self.alive and self.nr_conns < self.worker_connections:
            if not may_accept(self._holds(), others, ACCEPT_SLACK):
                return
            try:
                sock, client = listener.accept()
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue  # that one gave up; the next may be there
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return  # none left
                if exc.errno in OUT_OF_ROOM:
                    # The rest wait in the listen queue (for another worker, or until
                    # NO_ROOM_SECONDS have passed) rather than this worker failing with every
                    # connection it holds; said once until a connection is accepted again.
                    if self._no_room_until is None:
                        self.log.warning("accepting connections: %s; %s held", exc, self.nr_conns)
                    self._no_room_until = clock() + NO_ROOM_SECONDS
                    return
                raise
            self._no_room_until = None
            conn = _Conn(self.cfg, sock, client, server)
            self.nr_conns += 1
            self._unread_change(conn, accepted=True)
            # Without the worker's lock, as `_unregister`: a new descriptor, no thread's yet.
            self.poller.register(
                conn.sock, selectors.EVENT_READ, partial(self.on_client_socket_readable, conn)
            )
            self._wait(conn, FIRST_BYTE_TIMEOUT)  # for its request's first byte
            self._accepted.append((clock(), weakref.ref(conn), conn.waits))

    def on_client_socket_readable(self, conn: Any, client: Any) -> None:
        """gthread hands a connection to a thread as soon as it is readable, and the thread
        waits for the rest of the request: a few dozen clients that send a request slowly, or
        only its start, held every thread (seen: 500 connections that sent a request line and
        nothing more stalled every other client for a minute). Here the loop reads what comes
        and hands the request over once all of it is there (`arrival`); until then the
        connection waits in the loop, at most READ_TIMEOUT, then gets a 408."""
        self._unread_change(conn, accepted=False)  # counted as a request from now on, if any
        if not self._gathers:
            conn.waits += 1  # a thread reads its request, within _Arriving's deadline
            super().on_client_socket_readable(conn, client)
            return
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data and not conn.early:  # closed before a request
            self._drop(conn)
            return
        kept = False  # a kept-alive connection's next request has begun: off the keep-alive queue
        if conn.initialized:
            with self._lock:
                kept = conn in self._keep
                if kept:
                    self._keep.remove(conn)
        begins = not conn.early  # its first bytes: the read deadline runs from now
        conn.early += data
        # At the end of the stream (a client that shut down its side after sending), what came
        # is all there is: the thread answers it, or finds it cut short.
        if not data:
            verdict, expect, conn.ended = Arrival.READY, False, True
        elif len(conn.early) < conn.complete_at:
            verdict, expect = Arrival.WAIT, False  # more of a body whose head was read
        elif conn.walk is not None:  # more of a chunked body: its walk goes on
            conn.complete_at = conn.walk.to_come(conn.early)
            verdict, expect = (Arrival.WAIT if conn.complete_at else Arrival.READY), False
        else:
            verdict, expect, conn.complete_at, conn.walk = arrival(
                conn.early, body_bytes=self._body_bytes, fresh=len(data)
            )
        if verdict == Arrival.WAIT and kept and not _past_empty_lines(conn.early):
            # Empty lines alone on a kept-alive connection (RFC 9112 2.2: passed over): it stays
            # kept alive, where a request deadline closed it unanswered READ_TIMEOUT later and a
            # pooled client's next request met a closed connection. Its keep-alive starts again;
            # past EMPTY_LINE_BYTES of them, its 400 (`arrival`, `_Request`).
            conn.set_timeout()
            with self._lock:
                self._keep.append(conn)
        elif verdict == Arrival.WAIT:
            if kept or begins:  # the deadline of a request under way, from its first byte
                self._wait(conn, READ_TIMEOUT)
            if expect and not conn.continued:  # the client waits for it before its body
                _continue(conn)
        elif verdict == Arrival.INVALID:
            self._refuse(conn, conn.early)
            self._linger(conn)
        else:
            conn.waits += 1  # no longer waiting in the loop
            conn.complete_at, conn.walk = 0, None
            self._unregister(client)
            self.enqueue_req(conn)

    def _unregister(self, client: Any) -> None:
        """Take a connection the loop holds out of the poller, without the worker's lock: in a
        burst that lock is wanted by every request thread finishing (to register its kept-alive
        connection), and the loop, taking it once per request, spent most of its time waiting
        for it (py-spy, a burst of 10,000: 58 % of the loop's samples at that lock), while the
        listen queue overflowed. No other thread touches this connection's entry while the loop
        holds the connection, and the selector's map is a dict whose single operations the
        interpreter lock keeps whole; the threads register other connections meanwhile."""
        self.poller.unregister(client)

    @cached_property
    def _chunks_too_long(self) -> str:
        return (
            f"a chunked body longer than {self._body_bytes} bytes, or with a line longer than"
            f" {LINE_BYTES}, is not read here"
        )

    @cached_property
    def _body_bytes(self) -> int:
        """The longest body the loop reads before the request goes to a thread: the app's
        DATA_UPLOAD_MAX_MEMORY_SIZE (it refuses a longer one unread, 413)."""
        from django.conf import settings

        limit = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None)
        return HEAD_BYTES if limit is None else int(limit)

    # --- connections waiting in the loop -------------------------------------------------

    def _wait(self, conn: Any, seconds: float | None) -> None:
        """`conn` waits in the loop from now, for at most `seconds` (None: no limit)."""
        conn.waits += 1
        if seconds is not None:
            self._waits.add(clock() + seconds, conn)

    def _expire_waits(self) -> None:
        """Past its deadline: a lingering connection is closed; one whose request has begun
        is answered 408 and lingers; one that sent nothing is closed (gthread kept a
        connection that never sent a byte open for ever). What came before the deadline counts,
        read now if the loop has not read it yet (`_read_what_came`)."""
        for conn in self._waits.past(clock()):
            if conn.linger:
                self._drop(conn)
            elif self._read_what_came(conn):
                continue
            elif _past_empty_lines(conn.early):
                answer = _timed_out()
                with contextlib.suppress(OSError):
                    conn.sock.send(_without_body(answer) if _asks_head(conn.early) else answer)
                self._linger(conn)
            else:
                self._drop(conn)

    def _read_what_came(self, conn: Any) -> bool:
        """Read what a connection past its deadline sent and the loop has not read, as its
        readable event would; whether it moved on (its request to a thread, refused, or closed
        by its client) rather than still waiting. A pass of the loop can take longer than the
        deadline (a burst's thousands of events, each behind the request threads): a connection
        it accepted near its start, its request in the socket since, comes to its deadline at
        the end of that pass, before the next poll has shown it readable. Closed unread, the
        kernel reset it and its client never heard back (hot bursts on a slow machine: up to
        689 of 10,000 requests lost)."""
        # Not yet in the poller: a thread that gave the connection back to the loop set its
        # deadline first and has not registered it yet; its readable event is to come.
        sock = conn.sock
        if sock.fileno() == -1 or sock not in self.poller.get_map() or not _request_waiting(sock):
            return False
        waits = conn.waits
        self.on_client_socket_readable(conn, sock)
        return conn.waits != waits

    def _poll_seconds(self) -> float:
        """How long the loop waits for its sockets: until the next deadline of a connection
        waiting in it, at most a second (IDLE_POLL_SECONDS while it does not poll the listening
        socket). One set by a thread during the wait may be passed by up to that much."""
        wait = 1.0 if self._listening else IDLE_POLL_SECONDS
        first = self._waits.first()
        return wait if first is None else min(wait, max(first - clock(), 0.0))

    def _drop(self, conn: Any) -> None:
        """Close a connection the loop holds."""
        conn.waits += 1
        with self._lock:
            # A socket a thread closed already (gunicorn closes one whose answer failed midway)
            # is in no poller: a thread held it. Asked to unregister it, the selector would look
            # for it through its whole map, which the loop changes without this lock.
            if conn.sock.fileno() != -1:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self.poller.unregister(conn.sock)
            with contextlib.suppress(ValueError):
                self._keep.remove(conn)
        self.nr_conns -= 1
        conn.close()

    def _linger(self, conn: Any) -> None:
        """Close after an answer while the client may still be sending: stop writing, then read
        and drop what comes until the client closes its side or LINGER_SECONDS pass."""
        conn.linger = True
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            conn.sock.setblocking(False)
        except OSError:
            self._drop(conn)
            return
        drain = partial(self._drain, conn)
        # Its deadline before the loop can see it: the loop may close it at once (the client's
        # end already there), and a deadline set after would close it a second time.
        self._wait(conn, LINGER_SECONDS)
        with self._lock:
            try:
                self.poller.modify(conn.sock, selectors.EVENT_READ, drain)
            except KeyError:  # from a thread: not in the loop
                self.poller.register(conn.sock, selectors.EVENT_READ, drain)

    def _drain(self, conn: Any, client: Any) -> None:
        for _ in range(16):  # a fast sender leaves the loop to the others between reads
            try:
                if not conn.sock.recv(262144):
                    break
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                break
        else:
            return
        self._drop(conn)

    def murder_keepalived(self) -> None:
        """gthread's, except that a kept-alive connection whose next request has come is served,
        not closed. A pass of the loop can take seconds in a burst (every call of it waits for
        the interpreter lock behind the request threads); gthread then closed every connection
        whose keep-alive had run out meanwhile, those whose next request had arrived during
        the pass included, unread: the kernel answers that with a reset and the client never
        hears back (seen in hot bursts: a client that sent its next request 40 ms after its
        answer was reset 2.1 s later)."""
        now = time.time()
        # First without the lock (`_unregister`): only the loop takes from the queue's head, the
        # threads add at its tail, so a head not due yet stays so for this pass.
        with contextlib.suppress(IndexError):
            if not self._keep or self._keep[0].timeout > now:
                return
        self._close_kept(lambda conn: conn.timeout <= now)

    def _make_room(self) -> None:
        """A worker that holds `worker_connections` while connections wait in the listen queue
        closes its longest idle kept-alive connections, then, if it is still full, those that
        have sent nothing for SILENT_EVICT_SECONDS, EVICT_BATCH at most per pass of its loop
        (nginx reuses its idle keep-alive connections the same way). With a keep-alive as long
        as REDPACK_WEB_KEEPALIVE, a burst's answered clients would otherwise keep the next burst
        out of a full worker until their keep-alive ran out; and with FIRST_BYTE_TIMEOUT, about
        170 connections a second that never send a byte would fill it. One whose request has
        come is served, not closed."""
        self._forget_accepted()
        if self.nr_conns < self.worker_connections:
            return
        if not (self._keep or self._silent_since(SILENT_EVICT_SECONDS)):
            return
        if not select.select(self.sockets, [], [], 0)[0]:
            return  # nobody waits for the room
        asked = itertools.count()  # how often `_close_kept` asked for one more
        self._close_kept(lambda conn: next(asked) < EVICT_BATCH)
        if self.nr_conns >= self.worker_connections:
            self._close_silent(EVICT_BATCH - min(next(asked), EVICT_BATCH))

    def _forget_accepted(self) -> None:
        """Drop the head of `_accepted` while its connection is gone or has sent something; and
        the whole of it but the silent ones, when it holds twice the worker's connections (one
        silent connection at its head, with no first-byte limit, would keep every later entry)."""
        accepted = self._accepted
        if len(accepted) > 2 * self.nr_conns + EVICT_BATCH:
            self._accepted = accepted = deque(
                entry for entry in accepted if _still_waiting(*entry[1:]) is not None
            )
        while accepted and _still_waiting(*accepted[0][1:]) is None:
            accepted.popleft()

    def _silent_since(self, seconds: float) -> bool:
        """Whether the oldest connection still silent (`_forget_accepted` called before) was
        accepted `seconds` ago or more."""
        return bool(self._accepted) and self._accepted[0][0] <= clock() - seconds

    def _close_silent(self, most: int) -> None:
        """Close up to `most` of the connections that have sent nothing for SILENT_EVICT_SECONDS
        since their accept, the oldest first; one whose request has come meanwhile is read
        instead (`_read_what_came`)."""
        while most > 0 and self._silent_since(SILENT_EVICT_SECONDS):
            _, ref, _ = self._accepted.popleft()
            conn = ref()
            if conn is not None and not self._read_what_came(conn):
                self._drop(conn)
                most -= 1
            self._forget_accepted()

    def _close_kept(self, due: Any) -> None:
        """Take kept-alive connections from the head of the queue (the longest idle first) while
        `due(head)`: closed, or to a thread if its next request has come."""
        while True:
            with self._lock:
                if not self._keep or not due(self._keep[0]):
                    return
                conn = self._keep[0]
                waiting = _request_waiting(conn.sock)
                if not waiting:
                    self._keep.popleft()
                    self.nr_conns -= 1
                    # Already out of the poller is fine, as in gthread's.
                    with contextlib.suppress(KeyError, ValueError, OSError):
                        self.poller.unregister(conn.sock)
            if waiting:
                # Off the keep-alive queue and to a thread, as its readable event would have.
                self.on_client_socket_readable(conn, conn.sock)
            else:
                conn.close()

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._ready_to_accept(False)  # graceful stop: the others stop counting on this one now
        super().handle_exit(sig, frame)

    # --- the loop ------------------------------------------------------------------------

    def _listen(self, wanted: bool) -> None:
        if wanted == self._listening:
            return
        with self._lock:
            for sock in self.sockets:
                if wanted:
                    self.poller.register(sock, selectors.EVENT_READ, self._acceptors[sock])
                else:
                    self.poller.unregister(sock)
        self._listening = wanted

    @cached_property
    def _acceptors(self) -> dict[Any, Any]:
        """What the poller calls for each listening socket when it is readable (gthread's
        `accept`, given the socket's address)."""
        return {sock: partial(self.accept, sock.getsockname()) for sock in self.sockets}

    def _serve(self, events: list[tuple[Any, int]]) -> None:
        """A pass's events, the listening sockets given a turn (`accept`, within the balance
        rule, while the worker has room) each time the pass has spent ACCEPT_TURN_SECONDS on
        them. In a burst a pass handles thousands of events, each behind the request threads for
        the interpreter lock; accepting only between passes, the workers let the kernel's listen
        queue overflow, and its clients sent again after their back-off (docs/benchmarks.md,
        "Accepting in a long pass")."""
        turn = clock() + ACCEPT_TURN_SECONDS
        for key, _ in events:
            key.data(key.fileobj)
            now = clock()
            if now >= turn:
                turn = now + ACCEPT_TURN_SECONDS
                if self._room():
                    for sock, acceptor in self._acceptors.items():
                        acceptor(sock)

    def run(self) -> None:
        for sock in self.sockets:
            sock.setblocking(False)
            defer_accept(sock)  # the listener the workers share: each sets the same
        try:
            while self.alive:
                self.notify()
                self._make_room()
                room = self._room()
                self._ready_to_accept(room)
                self._tally()
                self._forget_silent()
                self._listen(room and may_accept(self._holds(), self._others(), ACCEPT_SLACK))
                self._serve(self.poller.select(self._poll_seconds()))
                if not self.is_parent_alive():
                    break
                self.murder_keepalived()
                self._expire_waits()
        finally:
            self._ready_to_accept(False)  # exiting: the others no longer wait for this one
        self.tpool.shutdown(False)
        self.poller.close()
        for sock in self.sockets:
            sock.close()
        with self._pending_lock:
            pending = list(self._pending)
        futures.wait(pending, timeout=self.cfg.graceful_timeout)
