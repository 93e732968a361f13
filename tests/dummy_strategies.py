"""Strategies that exist only to drive the machinery around strategies (registry, logs, health).

They keep no state: prepare does nothing and grab answers the same thing every time.
"""

import threading

from django.db import OperationalError

from strategies.base import CloseResult, GrabResult, GrabStrategy, Outcome, StrategyHealth


class _Dummy(GrabStrategy):
    label = "dummy"
    tradeoff = "Exists for tests only."

    def prepare(self, activity) -> None:  # type: ignore[no-untyped-def]
        pass

    def close(self, *, activity_id: int) -> CloseResult:
        return CloseResult(0, 0)


class ContendedStrategy(_Dummy):
    name = "contended"

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        return GrabResult(Outcome.CONTENDED)


class BrokenStrategy(_Dummy):
    name = "broken"

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        raise RuntimeError("the strategy broke")


class LockTimeoutStrategy(_Dummy):
    name = "lock_timeout"

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        raise OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction")


class LaggingStrategy(_Dummy):
    name = "lagging"

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        return GrabResult(Outcome.SOLD_OUT)

    def health(self) -> StrategyHealth | None:
        return StrategyHealth(2.5, {})


class UnsettledStrategy(_Dummy):
    """Its grabs never reach MySQL, so a refund can never settle."""

    name = "unsettled"

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        return GrabResult(Outcome.SOLD_OUT)

    def settle(self, *, activity_id: int, timeout: float) -> bool:
        return False


class OtherDatabaseStrategy(_Dummy):
    name = "other_database"
    requires = frozenset({"oracle"})

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        return GrabResult(Outcome.SOLD_OUT)


class HeldStrategy(_Dummy):
    """Its grabs wait until a test lets them go (`release`); `entered` counts them in."""

    name = "held"
    entered = threading.Semaphore(0)
    release = threading.Event()

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        HeldStrategy.entered.release()
        if not HeldStrategy.release.wait(timeout=30):
            raise RuntimeError("the test never released the held grab")
        return GrabResult(Outcome.CONTENDED)


DUMMIES = {
    cls.name: f"tests.dummy_strategies.{cls.__name__}"
    for cls in (
        ContendedStrategy,
        BrokenStrategy,
        LockTimeoutStrategy,
        LaggingStrategy,
        UnsettledStrategy,
        OtherDatabaseStrategy,
        HeldStrategy,
    )
}
