"""The grab contract every strategy implements (shaped like Django's cache/email backends).

- prepare(activity): called inside the send transaction, once the activity row exists.
- grab(activity_id=, user_id=) -> GrabResult: one attempt; never raises for an expected outcome.
- close(activity_id=) -> CloseResult: stop grabs atomically and report what is left.
- settle(activity_id=, timeout=): wait until pending writes reached MySQL (async strategies).
- audit(activity): strategy-specific invariant checks (e.g. Redis agrees with MySQL).
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

from django.utils import timezone

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


@dataclass(frozen=True)
class CloseResult:
    remaining_count: int
    remaining_cents: int


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
    # For the bench's Redis ceiling (`manage.py compare`): the strategy's one-round-trip grab
    # script in strategies/lua/ and its EVALSHA arguments after the SHA, with "$activity",
    # "$user", "$now" and "$now_ms" (epoch seconds, milliseconds) standing for their values:
    #   ("grab.lua", "2", "rp:{$activity}:packets", "rp:{$activity}:grabbed", "$user")
    # compare prepares a real activity of this strategy and runs the script with
    # redis-benchmark. None: no such script (the MySQL strategies).
    ceiling_script: ClassVar[tuple[str, ...] | None] = None

    def prepare(self, activity: "Activity") -> None:
        raise NotImplementedError

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        raise NotImplementedError

    def close(self, *, activity_id: int) -> CloseResult:
        raise NotImplementedError

    def settle(self, *, activity_id: int, timeout: float) -> bool:
        """True once every acknowledged grab of the activity is in MySQL."""
        return True

    def persist_lag(self) -> float | None:
        """Seconds the oldest acknowledged grab has waited to reach MySQL, 0.0 when none waits;
        None for strategies that write before they answer. /healthz reports the largest."""
        return None

    def audit(self, activity: "Activity") -> list[str]:
        """Violations of strategy-specific invariants; the auditor adds the common ones."""
        return []


def refusal(activity: "Activity", existing_cents: int | None) -> GrabResult | None:
    """The answer when a loaded activity row cannot give this user a packet, else None.

    Call it under the same protection as the decrement, so a grab never lands after close.
    """
    if activity.status != "open" or activity.expires_at <= timezone.now():
        return GrabResult(Outcome.CLOSED)
    if existing_cents is not None:
        return GrabResult(Outcome.ALREADY_GRABBED, existing_cents)
    if activity.surplus_count <= 0:
        return GrabResult(Outcome.SOLD_OUT)
    return None
