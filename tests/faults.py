"""A TCP proxy that injects the faults of a real network between a client and MariaDB or Redis.

- `cut()`: every connection dropped, new ones refused, until `restore()`.
- `drop_reply(trigger, times=1)`: the next request whose bytes contain `trigger` is forwarded,
  its reply is read from the server (so the server surely acted on it) and thrown away, and the
  connection is closed: the client sees the connection drop with the outcome unknown. For
  Redis, trigger on a script's SHA1 (its EVALSHA); for MariaDB, on b"COMMIT". A MariaDB reply
  is read whole (`mysql_reply_done`): a multi-statement query ending in COMMIT gets one reply per
  statement, and the proxy closes only once the last one arrived.
  With `then_cut`, the proxy is cut (as `cut()`) before the client learns of the drop: asking
  the server what happened fails too.
- `cut_before(trigger, times=1)`: the connection is closed instead of forwarding the request:
  the server never sees it.
- `hold(trigger)`: the client's side of the connection is closed at once (it sees the drop, the
  outcome unknown) while the request waits in the proxy; `let_held_through()` then forwards it
  to the server, which acts on it later than the client gave up (a request still in flight, as
  through a proxy or a network path the client's side timed out of), and waits for its reply.
  What is held is the read that holds the trigger (as for every fault here, a request sent in
  one write, small enough for one read).
- `stall()`: what clients send is read and thrown away, their connections left open, until
  `heal()`: a server that stopped answering without closing (a host gone, no reset).
- `refuse_logins()`: each new MariaDB connection gets the server's greeting, then, instead of
  the server's answer to its login, the error MariaDB sends once it holds `max_connections`
  (`TOO_MANY_CONNECTIONS`), and is closed; connections already open go on, until `heal()`.

`RoundRobinProxy` spreads connections over several servers in turn (two web servers behind one
address, as behind nginx or HAProxy).

The proxy works on whole reads of the client's socket; the clients used here (redis-py,
mysqlclient) send each command in one write, small enough for one read.
"""

import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field

from tests.servers import free_port

# MariaDB's answer to a login while it holds max_connections (ER_CON_COUNT_ERROR, 1040), as
# read off a MariaDB 10.11 at its limit: the packet after the client's login packet.
TOO_MANY_CONNECTIONS = b"\x1d\x00\x00\x02\xff\x10\x04#08004Too many connections"


@dataclass
class _Fault:
    trigger: bytes
    times: int
    forward: bool  # drop the reply (True) or cut before the request reaches the server
    then_cut: bool = False
    hold: bool = False  # forward only when let through, after the client saw the drop
    held: tuple[socket.socket, bytes] | None = None  # the server's side and the request
    answered: threading.Event = field(default_factory=threading.Event)  # its reply read whole


class FaultProxy:
    def __init__(
        self, target: tuple[str, int], *, reply_done: Callable[[bytes], bool] = lambda _: True
    ) -> None:
        """`reply_done(bytes)`: whether the bytes read from the server hold a whole reply (the
        default: any bytes do, right for Redis's one-line replies)."""
        self.target = target
        self.reply_done = reply_done
        self.port = free_port()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listening = threading.Event()
        self.fault: _Fault | None = None
        self.holding: _Fault | None = None  # armed by hold(), until let through
        self.fired = 0  # faults injected so far
        self.login_reply: bytes | None = None  # refuse_logins: the answer to a new login
        self.stalling = False  # stall(): requests read and thrown away
        # What stall() threw away, read by read, each with whether it was a login (a
        # connection's first packet) or a request on a connection logged in before.
        self.swallowed: list[tuple[bool, bytes]] = []
        self.restore()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def restore(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: same port
        server.settimeout(0.1)
        self.listening.set()
        self.acceptor = threading.Thread(target=self._accept, args=(server,), daemon=True)
        self.acceptor.start()

    def cut(self) -> None:
        self.listening.clear()
        self.acceptor.join()  # the listening socket is closed: connects are refused
        with self.lock:
            for sock in self.sockets:
                _close(sock)
            self.sockets.clear()

    def drop_reply(self, trigger: bytes, times: int = 1, *, then_cut: bool = False) -> None:
        with self.lock:
            self.fault = _Fault(trigger, times, forward=True, then_cut=then_cut)

    def cut_before(self, trigger: bytes, times: int = 1) -> None:
        with self.lock:
            self.fault = _Fault(trigger, times, forward=False)

    def hold(self, trigger: bytes) -> None:
        with self.lock:
            self.fault = _Fault(trigger, 1, forward=True, hold=True)
            self.holding = self.fault

    def holds_a_request(self) -> bool:
        """Whether the request armed by `hold` arrived and waits in the proxy."""
        with self.lock:
            return self.holding is not None and self.holding.held is not None

    def let_held_through(self, timeout: float = 30) -> None:
        """Forward the held request and wait until the server has answered it (the answer is
        thrown away: the client is gone)."""
        with self.lock:
            fault, self.holding = self.holding, None
        assert fault is not None and fault.held is not None, "no request is held"
        upstream, data = fault.held
        upstream.sendall(data)
        assert fault.answered.wait(timeout), "the server did not answer the held request"

    def stall(self) -> None:
        with self.lock:
            self.stalling = True

    def refuse_logins(self, reply: bytes = TOO_MANY_CONNECTIONS) -> None:
        with self.lock:
            self.login_reply = reply

    def heal(self) -> None:
        """No more faults (those armed and not yet fired are forgotten)."""
        with self.lock:
            self.fault = None
            self.login_reply = None
            self.stalling = False

    def _connect(self) -> socket.socket:
        return socket.create_connection(self.target)

    def _take_fault(self, data: bytes) -> _Fault | None:
        with self.lock:
            fault = self.fault
            if fault is None or fault.trigger not in data:
                return None
            fault.times -= 1
            if fault.times <= 0:
                self.fault = None
            self.fired += 1
            return fault

    def _accept(self, server: socket.socket) -> None:
        with server:
            while self.listening.is_set():
                try:
                    client, _ = server.accept()
                except TimeoutError:
                    continue
                upstream = self._connect()
                with self.lock:
                    self.sockets += [client, upstream]
                swallow: list[_Fault] = []  # the fault whose reply is now dropped
                for pump, args in (
                    (self._requests, (client, upstream, swallow)),
                    (self._replies, (upstream, client, swallow)),
                ):
                    threading.Thread(target=pump, args=args, daemon=True).start()

    def _requests(
        self, client: socket.socket, upstream: socket.socket, swallow: list[_Fault]
    ) -> None:
        login = True  # the client's first packet: its login, after the server's greeting
        try:
            while data := client.recv(65536):
                with self.lock:
                    stalled = self.stalling
                    self.fired += stalled
                    if stalled:
                        self.swallowed.append((login, data))
                if stalled:
                    continue
                if login:
                    login = False
                    with self.lock:
                        refusal = self.login_reply
                        self.fired += refusal is not None
                    if refusal is not None:
                        client.sendall(refusal)
                        break
                fault = self._take_fault(data)
                if fault is None:
                    upstream.sendall(data)
                elif fault.hold:
                    swallow.append(fault)  # its reply, once let through, is read and dropped
                    with self.lock:
                        fault.held = (upstream, data)
                    _close(client)  # the client sees the drop; the server has not seen this
                    return
                elif fault.forward:
                    swallow.append(fault)  # before the server can answer
                    upstream.sendall(data)
                    return  # _replies closes both once the answer arrived
                else:
                    break
        except OSError:
            pass
        _close(client)
        _close(upstream)

    def _replies(
        self, upstream: socket.socket, client: socket.socket, swallow: list[_Fault]
    ) -> None:
        swallowed = b""
        try:
            while data := upstream.recv(65536):
                if swallow:  # the server acted and answered; the client never hears it
                    swallowed += data
                    if not self.reply_done(swallowed):
                        continue
                    if swallow[0].then_cut:
                        self.cut()
                    swallow[0].answered.set()
                    break
                client.sendall(data)
        except OSError:
            pass
        _close(client)
        _close(upstream)


def mysql_reply_done(data: bytes) -> bool:
    """Whether `data` holds MariaDB's whole reply to a query: an error packet, a packet of rows
    (the proxy drops replies only to writes, so rows are not followed further), or an OK packet
    without SERVER_MORE_RESULTS_EXISTS (the last statement's of a multi-statement query)."""
    at = 0
    while at + 4 <= len(data):
        length = int.from_bytes(data[at : at + 3], "little")
        body = data[at + 4 : at + 4 + length]
        if len(body) < length:
            return False
        at += 4 + length
        if body[:1] != b"\x00":
            return True
        field = 1
        for _ in range(2):  # affected rows, last insert id: length-encoded integers
            field += _LENGTH_ENCODED.get(body[field], 1)
        status = int.from_bytes(body[field : field + 2], "little")
        if not status & _SERVER_MORE_RESULTS_EXISTS:
            return True
    return False


_LENGTH_ENCODED = {0xFC: 3, 0xFD: 4, 0xFE: 9}  # first byte -> the integer's bytes in all
_SERVER_MORE_RESULTS_EXISTS = 0x0008


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class RoundRobinProxy(FaultProxy):
    """A load balancer in miniature: each new connection goes to the next of `targets` in turn
    (the faults above work as well)."""

    def __init__(self, targets: list[tuple[str, int]]) -> None:
        self.targets = targets
        self.connections = 0
        super().__init__(targets[0])

    def _connect(self) -> socket.socket:
        with self.lock:
            target = self.targets[self.connections % len(self.targets)]
            self.connections += 1
        return socket.create_connection(target)
