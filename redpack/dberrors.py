"""The MySQL/MariaDB error numbers this project acts on, named once, and how to read one off a
driver's exception (mysqlclient puts it first in `args`)."""

from django.db import InterfaceError, OperationalError

LOCK_WAIT_TIMEOUT = 1205  # ER_LOCK_WAIT_TIMEOUT
DEADLOCK = 1213  # ER_LOCK_DEADLOCK
LOCK_NOWAIT = 3572  # ER_LOCK_NOWAIT
# A lock wait that gave up: the statement (with a deadlock, the transaction) was rolled back and
# may be made again.
LOCK_GAVE_UP = frozenset({LOCK_WAIT_TIMEOUT, DEADLOCK, LOCK_NOWAIT})
# The client could not reach the server, or lost it during the handshake: CR_CONNECTION_ERROR,
# CR_CONN_HOST_ERROR, CR_SERVER_LOST.
UNREACHABLE = frozenset({2002, 2003, 2013})
# An open connection that no longer reaches its server (CR_SERVER_GONE_ERROR, CR_SERVER_LOST;
# MySQL 8.0.24+ names an idle one it closed, ER_CLIENT_INTERACTION_TIMEOUT): the statement that
# found out may not have run, and the connection is of no further use.
SERVER_GONE = 2006  # CR_SERVER_GONE_ERROR
CONNECTION_LOST = frozenset({SERVER_GONE, 2013, 4031})
# The server refused a new connection: it holds as many as it allows (ER_CON_COUNT_ERROR at
# max_connections, ER_TOO_MANY_USER_CONNECTIONS at the user's max_user_connections). Nothing was
# sent on it; the server is there but cannot take this client now.
USER_LIMIT = 1203
REFUSED = frozenset({1040, USER_LIMIT})
# The server ended the session under a statement (ER_SERVER_SHUTDOWN while it stops,
# ER_CONNECTION_KILLED), or its name did not resolve (CR_UNKNOWN_HOST).
SESSION_ENDED = frozenset({1053, 1927, 2005})


def code(exc: BaseException) -> object:
    """The error number the driver gave `exc` (None when it gave none)."""
    return exc.args[0] if exc.args else None


def connection_failed(exc: BaseException) -> bool:
    """MySQL could not be reached, refused a new connection (REFUSED), or its connection was
    lost or unusable: whatever the statement was, it may or may not have run (InterfaceError:
    the driver's connection was already closed; Django's is no DatabaseError)."""
    if isinstance(exc, InterfaceError):
        return True
    lost = UNREACHABLE | REFUSED | CONNECTION_LOST | SESSION_ENDED
    return isinstance(exc, OperationalError) and code(exc) in lost
