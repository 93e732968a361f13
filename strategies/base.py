"""The grab contract every strategy implements (shaped like Django's cache/email backends).

Required:
- prepare(activity): called inside the send transaction, once the activity row exists.
- grab(activity_id=, user_id=) -> GrabResult: one attempt; never raises for an expected outcome.
- close(activity_id=) -> CloseResult: stop grabs atomically and report what is left.

Optional capabilities, with working defaults for a strategy that writes MySQL before it answers
and keeps no other state. The rest of the project asks for them through the registry and never
looks at a strategy's class:
- settle(activity_id=, timeout=): wait until pending writes reached MySQL (write-behind).
- health(), persist_lag(), pending_writes(activity_id=): how far MySQL trails the answers.
- background_tasks(): periodic work the Celery tasks run (a persister, its crash recovery).
- retry_failed_write(failure_id=): the admin's retry of a grab that failed to reach MySQL.
- rebuild(activity_id=): rewrite state kept outside MySQL from MySQL (`rebuildable`).
- state_lost(): why open activities have lost that state (Redis restarted empty), or None;
  /healthz says `degraded` meanwhile.
- audit(activity): strategy-specific invariant checks (e.g. Redis agrees with MySQL).
- holders(activity_id=): who holds a packet (the fast answers of a sold-out activity).
- raw_grab(cursor, activity_id=, user_id=): the grab's own statements on a plain DB-API
  cursor (mysqlclient, autocommit), without Django: the lab's raw same-SQL ceiling
  (redpack/lab/ceilings.py). None for a strategy that has no such measure.
- raw_batch(cursor, activity_id=, grabs=): a batch's own MySQL statements (grabs: (user id,
  cents, packet id or None), already decided), one transaction, on a plain cursor: the lab's
  batched raw same-SQL ceiling of a strategy that writes its batches inside the request. None
  otherwise.
"""

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from redpack.models import Activity


class Outcome(StrEnum):
    GRABBED = "grabbed"
    ALREADY_GRABBED = "already_grabbed"
    SOLD_OUT = "sold_out"
    CLOSED = "closed"
    CONTENDED = "contended"  # nothing this time although packets may remain; try again


@dataclass(frozen=True)
class GrabResult:
    outcome: Outcome
    amount_cents: int | None = None  # set for grabbed and already_grabbed
    reason: str | None = None  # why `contended`, when the caller can act on it ("shed")


@dataclass(frozen=True)
class RequestChecks:
    """A web request's own checks (redpack/api/gate.py), for a strategy that makes them in its
    grab's round trip (`GrabStrategy.carries_checks`): is the user in the bans set, and, when
    `window_key` is set, does this request fit the user's throttle window (counted there)."""

    bans_key: str
    window_key: str | None = None
    limit: int = 0
    expire_seconds: int = 0


@dataclass(frozen=True)
class Holders:
    """Who holds a packet of an activity: user -> cents of the grabs that are settled, and the
    users whose grab is decided but not yet answerable (a mark whose row is being written)."""

    cents: dict[int, int]
    unsettled: frozenset[int] = frozenset()


@dataclass(frozen=True)
class CloseResult:
    remaining_count: int
    remaining_cents: int


@dataclass(frozen=True)
class PendingWrites:
    """An activity's grabs answered but not yet in MySQL."""

    waiting: int  # on their way (a write-behind queue)
    failed: int  # failed on their own and wait for a person (retry_failed_write)


@dataclass(frozen=True)
class StrategyHealth:
    """How far MySQL trails a write-behind strategy's answers, read once."""

    persist_lag: float  # seconds the oldest acknowledged grab has waited for MySQL, 0.0: none
    sections: Mapping[str, object]  # added to /healthz by key


# The activity of the grab under way and what answers it from memory once the activity ended
# (redpack/finished.py), set by the service around each strategy call for a grab that started
# before its process knew the end. A strategy whose grab waited in its process while it had
# written nothing and held no lock for it (turns.turn with `ask_known`) asks it after the wait:
# a grab that queued while the last packets went is answered from memory, as the grabs that
# arrive after the end are, without the lock and the transaction that would only tell it so.
known_answer: ContextVar[tuple[object, Callable[[], "GrabResult | None"]] | None] = ContextVar(
    "known_answer", default=None
)


class AnsweredMeanwhile(Exception):
    """The grab waited, and its answer became known meanwhile (`known_answer`): it had written
    nothing and held no lock, and takes none; `result` is the answer."""

    def __init__(self, result: "GrabResult") -> None:
        super().__init__(result.outcome.value)
        self.result = result


class TooMany(Exception):
    """More holders than the caller keeps (GrabStrategy.holders)."""


class NotRebuildable(Exception):
    """The strategy cannot rewrite this activity's state from MySQL now (it keeps none, or MySQL
    is not yet the whole truth about it); the message says why."""


BackgroundTask = Callable[[], int]  # runs once, returns how many items it moved


class GrabStrategy:
    name: ClassVar[str]
    label: ClassVar[str]
    tradeoff: ClassVar[str]  # one line, shown by /api/strategies/ and the admin
    # Database vendors (Django's connection.vendor) on which this strategy is exact; empty: any.
    # Elsewhere it is listed as unavailable with the reason, never run, e.g. SKIP LOCKED needs
    # {"mysql"}: SQLite (the embedded fallback of `make run`) has no row locks to skip. On
    # SQLite every transaction takes the write lock at BEGIN and SELECT … FOR UPDATE is a no-op;
    # DECIMAL arithmetic in SQL is floating point there: decrement amounts with money.minus.
    requires: ClassVar[frozenset[str]] = frozenset()
    safe: ClassVar[bool] = True  # False: oversells under contention, refused unless allowed
    # Keeps state outside MySQL (Redis) that rebuild() can rewrite from MySQL.
    rebuildable: ClassVar[bool] = False
    # Needs Redis to grab (its state or a lock); False: MySQL alone decides (the report's
    # "MySQL only" recommendation).
    uses_redis: ClassVar[bool] = False
    # The setting that bounds this strategy's line of grabs per activity in a web process
    # (redpack/shedding.py): one more is answered `contended` (shed) at once.
    line_setting: ClassVar[str] = "REDPACK_GRAB_LINE"
    # Combines concurrent grabs of an activity in a process into one batch (combiner.py): its
    # batches grow with the grabs in flight per process (the lab runs it with more of them).
    batched: ClassVar[bool] = False
    # Optional: raw_grab(cursor, *, activity_id, user_id) -> None (see the module docstring).
    raw_grab: Callable[..., None] | None = None
    # Optional: raw_batch(cursor, *, activity_id, grabs) -> None (see the module docstring).
    raw_batch: Callable[..., None] | None = None

    def prepare(self, activity: "Activity") -> None:
        raise NotImplementedError("subclasses of GrabStrategy must provide a prepare() method")

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        raise NotImplementedError("subclasses of GrabStrategy must provide a grab() method")

    def carries_checks(self) -> bool:
        """Whether `grab_checked` makes a web request's checks in the grab's own round trip, so
        the request sends none of its own."""
        return False

    def grab_checked(self, *, activity_id: int, user_id: int, checks: RequestChecks) -> GrabResult:
        """`grab`, with the request's `checks` made first, in the same step: RequestRefused
        (redpack/errors.py) when the user is disabled or over its throttle, and nothing taken."""
        raise NotImplementedError(f"{self.name} makes no request checks (carries_checks)")

    def close(self, *, activity_id: int) -> CloseResult:
        raise NotImplementedError("subclasses of GrabStrategy must provide a close() method")

    def settle(self, *, activity_id: int, timeout: float) -> bool:
        """True once every acknowledged grab of the activity is in MySQL."""
        return True

    def health(self) -> StrategyHealth | None:
        """The persist lag and the sections this strategy adds to /healthz; None for strategies
        that write before they answer."""
        return None

    def persist_lag(self) -> float | None:
        """Seconds the oldest acknowledged grab has waited to reach MySQL, 0.0 when none waits;
        None for strategies that write before they answer. /healthz reports the largest."""
        health = self.health()
        return None if health is None else health.persist_lag

    def pending_writes(self, *, activity_id: int) -> PendingWrites | None:
        """The activity's grabs not yet in MySQL; None for strategies that write before they
        answer (the admin shows it on the activity's page)."""
        return None

    def background_tasks(self) -> Mapping[str, BackgroundTask]:
        """Periodic work by task name; redpack/tasks.py runs each distinct one once per beat.
        Return module-level functions, so that strategies sharing a mechanism share the task."""
        return {}

    def retry_failed_write(self, *, failure_id: int) -> str | None:
        """Write a grab that failed to reach MySQL (a PersistFailure row); None once it is
        there, else the error."""
        raise NotImplementedError(f"{self.name} writes every grab before it answers")

    def rebuild(self, *, activity_id: int) -> None:
        """Rewrite the activity's state kept outside MySQL from MySQL; idempotent."""
        raise NotRebuildable(f"{self.name} keeps no state outside MySQL")

    def state_lost(self) -> str | None:
        """Why open activities of the strategies sharing this implementation have lost the state
        they keep outside MySQL (Redis restarted empty), or None. Called by /healthz at most
        once a second per process, so it must cost the same however many activities there are
        (one Redis read while nothing is lost)."""
        return None

    def holders(self, *, activity_id: int, at_most: int) -> Holders | None:
        """Who holds a packet of the activity (redpack/finished.py answers a sold-out
        activity's grabs from it); None, the default: the grab rows in MySQL say it. TooMany
        when there are more than `at_most`, counted before reading them."""
        return None

    def audit(self, activity: "Activity") -> list[str]:
        """Violations of strategy-specific invariants; the auditor adds the common ones."""
        return []
