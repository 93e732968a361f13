"""Business rules: send, grab, expire (reads are in selectors.py, the send's checks in
validation.py)."""

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from functools import partial

from django.db import DatabaseError, close_old_connections, transaction
from django.utils import timezone
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import AuthorizationError as RedisAuthorizationError
from redis.exceptions import ClusterDownError as RedisClusterDown
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MasterDownError as RedisMasterDown
from redis.exceptions import OutOfMemoryError as RedisOutOfMemory
from redis.exceptions import ReadOnlyError as RedisReadOnly
from redis.exceptions import RedisError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeout
from redis.exceptions import TryAgainError as RedisTryAgain

from strategies import registry
from strategies.base import AnsweredMeanwhile, GrabResult, Outcome, RequestChecks, known_answer

from . import (
    allocation,
    bans,
    dberrors,
    expiry,
    finished,
    ledger,
    metrics,
    selectors,
    shards,
    shedding,
    validation,
)
from .errors import ChecksNotMade, NotFound, OutcomeUnknown, RedpackError, RequestRefused
from .hotsettings import hot
from .models import Activity
from .money import from_cents

logger = logging.getLogger(__name__)


def activity_send(
    *,
    sender_id: int,
    total_amount: Decimal,
    total_count: int,
    strategy: str,
    allocation_kind: str = allocation.Allocation.DOUBLE_AVERAGE,
    expires_in: int = validation.DEFAULT_EXPIRES_IN,
    funded: bool = True,
) -> Activity:
    """Take the total from the sender's wallet into the activity's escrow, create the activity
    and let its strategy prepare (pre-split packets, Redis state), in one transaction; a wallet
    that does not cover the total is 400 `insufficient_balance` and nothing is written.

    `funded=False` moves no money: only for the lab's ceilings, whose activity is removed right
    after (redpack/lab/ceilings.py); the auditor reports such an activity."""
    total_cents = validation.activity_send_validate(
        total_amount=total_amount,
        total_count=total_count,
        strategy=strategy,
        allocation_kind=allocation_kind,
        expires_in=expires_in,
    )
    activity = Activity(
        pk=shards.new_activity_id(),  # None: not sharded, the table's auto-increment
        sender_id=sender_id,
        total_amount=from_cents(total_cents),
        surplus_amount=from_cents(total_cents),
        total_count=total_count,
        surplus_count=total_count,
        strategy=strategy,
        allocation=allocation_kind,
        expires_at=timezone.now() + timedelta(seconds=expires_in),
    )
    if activity.pk is None:  # one database: the debit, the activity and its escrow at once
        with transaction.atomic():
            wallet_id = (
                ledger.send_debit(sender_id=sender_id, total_cents=total_cents) if funded else None
            )
            _activity_write(activity)
            if wallet_id is not None:
                ledger.escrow_open(
                    activity_id=activity.pk, wallet_id=wallet_id, total_cents=total_cents
                )
    else:
        # Sharded: the money is on the ledger database, the activity on its shard. The debit
        # commits first, keyed by the new id; an activity that then never appears leaves a
        # funded escrow without an activity, which the auditor reports (audit.audit_books).
        if funded:
            with transaction.atomic():
                wallet_id = ledger.send_debit(sender_id=sender_id, total_cents=total_cents)
                ledger.escrow_open(
                    activity_id=activity.pk, wallet_id=wallet_id, total_cents=total_cents
                )
        with shards.for_activity(activity.pk), shards.atomic():
            _activity_write(activity)
    logger.info(
        "activity sent",
        extra={
            "event": "activity_sent",
            "activity": activity.pk,
            "strategy": strategy,
            "count": total_count,
        },
    )
    return activity


def _activity_write(activity: Activity) -> None:
    """Inside the transaction of the activity's database: insert it and let its strategy
    prepare; it enters the expiry schedule once that commits."""
    activity.save(force_insert=True)
    registry.get(activity.strategy).prepare(activity)
    shards.on_commit(lambda: _register_expiry(activity))


def _register_expiry(activity: Activity) -> None:
    """The committed activity into the expiry schedule. With Redis away the send stands
    (answered 201): the expiry sweep registers the activity from MySQL once it is due."""
    try:
        expiry.register([activity])
    except RedisError as exc:
        metrics.store_error(exc, "expiry_register")
        logger.warning(
            "activity %s: expiry not registered in Redis; the sweep registers it once due",
            activity.pk,
            extra={"event": "expiry_not_registered", "activity": activity.pk, "error": exc},
        )


def grab_carries_checks(*, activity_id: int) -> bool:
    """Whether a grab request for this activity leaves its ban and throttle checks to the
    strategy's own round trip (GrabStrategy.carries_checks): `activity_grab` with `checks`.
    Not once this process knows the activity is finished: its grabs are answered from memory,
    without the strategy, so the request checks first (the gate), as for any strategy."""
    if not selectors.possible_id(activity_id) or finished.known(activity_id):
        return False
    try:
        name = _strategy_of(activity_id)
    except NotFound:
        return False  # the request's own checks first, then 404
    return registry.get(name).carries_checks()


def grab_answered_from_memory(*, activity_id: int, user_id: int) -> GrabResult | None:
    """The answer to a grab request that this process can give from its memory of the
    activity's end before asking anything (finished.answer_now: no Redis, no MySQL), counted as
    `activity_grab` counts its answers; None: the request goes the usual way. The ban is asked
    of this process's copy of the set (bans.disabled_locally): RequestRefused for a user it
    names. Not counted by the throttle: the answer costs less than counting it would."""
    if not selectors.possible_id(activity_id) or not finished.known(activity_id):
        return None
    disabled = bans.disabled_locally(user_id)
    if disabled is None:
        return None  # the copy cannot be read now: the request asks Redis itself
    if disabled:
        raise RequestRefused(disabled=True)
    started = time.perf_counter()
    with shards.for_activity(activity_id):
        result = finished.answer_now(activity_id, user_id)
    if result is not None:
        strategy_name = selectors.activity_strategy(activity_id)  # known: read before
        _answered(strategy_name, metrics.outcome_label(result), started)
    return result


def _answered(strategy_name: str, outcome: str, started: float) -> None:
    """Count a grab's answer, or the error instead of one (metrics.py: by strategy and outcome,
    with the time since `started`)."""
    metrics.grab_answered(strategy_name, outcome, time.perf_counter() - started)


def activity_grab(
    *,
    activity_id: int,
    user_id: int,
    finished_hint: str | bytes | None = None,
    finished_ttl_ms: int | None = None,
    bounded: bool = False,
    checks: RequestChecks | None = None,
) -> GrabResult:
    """One grab by one user: answered at once when the activity is known to be finished
    (finished.py; `finished_hint` and `finished_ttl_ms`: what the request's gate read of it in
    Redis); when `bounded` (a web request), refused `contended` at once if the activity's line
    in this process is full (shedding.py); else answered by the activity's strategy.

    Every answer of an existing activity, and every error instead of one, is counted here once
    (metrics.py: by strategy and outcome, with the time it took).

    `checks`: the web request's, for a strategy that makes them with the grab
    (`grab_carries_checks`, which is false for an activity this process knows is finished):
    RequestRefused when they fail, and nothing is taken."""
    if not selectors.possible_id(activity_id):
        raise selectors.no_such_activity(activity_id)
    strategy_name = _strategy_of(activity_id)
    started = time.perf_counter()
    try:
        with shards.for_activity(activity_id):
            result = _grab(
                activity_id,
                user_id,
                strategy_name,
                finished_hint,
                finished_ttl_ms,
                bounded=bounded,
                checks=checks,
            )
    except (RequestRefused, ChecksNotMade):
        raise  # the request's checks, not an answer of the grab (the view answers)
    except RedpackError as exc:  # outcome_unknown (503) and the other expected failures
        _answered(strategy_name, exc.code, started)
        metrics.store_error(exc, "grab")
        raise
    except Exception as exc:
        _answered(strategy_name, "error", started)
        metrics.store_error(exc, "grab")
        raise
    _answered(strategy_name, metrics.outcome_label(result), started)
    return result


def _grab(
    activity_id: int,
    user_id: int,
    strategy_name: str,
    finished_hint: str | bytes | None,
    finished_ttl_ms: int | None,
    *,
    bounded: bool,
    checks: RequestChecks | None,
) -> GrabResult:
    known = finished.answer(activity_id, user_id, finished_hint, finished_ttl_ms)
    if known is not None:
        return known
    strategy = registry.get(strategy_name)
    ids = {"activity": activity_id, "user": user_id}
    line = getattr(hot, strategy.line_setting)
    with shedding.place(activity_id, bounded=bounded, line=line) as placed:
        if not placed:
            logger.info("grab shed", extra={"event": "grab_contended", "reason": "shed", **ids})
            return GrabResult(Outcome.CONTENDED, reason="shed")
        # What a grab that waits in its process asks after the wait (strategies/base.py): only
        # one that started before the process knew the end; one sent on while it was known
        # (to renew the memory, holders not settled) goes to its strategy as it was sent.
        asked = (activity_id, partial(finished.answer, activity_id, user_id))
        asking = known_answer.set(None if finished.known(activity_id) else asked)
        try:
            with _unknown_when_unreachable(ids):
                if checks is None:
                    result = strategy.grab(activity_id=activity_id, user_id=user_id)
                else:
                    result = strategy.grab_checked(
                        activity_id=activity_id, user_id=user_id, checks=checks
                    )
        except AnsweredMeanwhile as meanwhile:
            return meanwhile.result  # from memory, as `known` above: nothing to learn
        except RedpackError:
            raise  # an expected failure, answered with its own code
        except Exception as exc:
            if isinstance(exc, DatabaseError) and is_lock_timeout(exc):
                # The strategy's transaction was rolled back (and its Redis state given back),
                # so nothing was granted: the honest answer is "try again", not a server error.
                logger.warning(
                    "grab lock timeout", extra={"event": "lock_timeout", "error": exc, **ids}
                )
                metrics.store_error(exc, "grab_lock_wait")
                return GrabResult(Outcome.CONTENDED)
            logger.exception("grab failed", extra={"event": "grab_failed", **ids})
            raise
        finally:
            known_answer.reset(asking)
    if result.outcome is Outcome.CONTENDED:
        logger.info("grab contended", extra={"event": "grab_contended", **ids})
    finished.learn(activity_id, result)
    return result


def _strategy_of(activity_id: int) -> str:
    """The activity's strategy, asked of MySQL once per process and activity: OutcomeUnknown
    (503) when MySQL cannot be reached for it, as for the grab itself."""
    with _unknown_when_unreachable({"activity": activity_id}):
        return selectors.activity_strategy(activity_id)


# A Redis that answers but takes no command now: a replica after a failover (READONLY; with
# replica-serve-stale-data off, MASTERDOWN), at maxmemory (OOM), short of the replicas
# min-replicas-to-write asks for (NOREPLICAS), unable to save (MISCONF), busy with a long script
# (BUSY), a cluster mid-change (TRYAGAIN, CLUSTERDOWN). The command refused wrote nothing: Redis
# 7 refuses a script (ours carry no flags) at its first write, or before it runs.
REDIS_REFUSED = (
    RedisReadOnly,
    RedisMasterDown,
    RedisOutOfMemory,
    RedisTryAgain,
    RedisClusterDown,
)
REDIS_REFUSED_REPLIES = ("BUSY ", "NOREPLICAS ", "MISCONF ")  # redis-py names no class for them


def store_unreachable(exc: BaseException) -> bool:
    """MySQL or Redis could not be reached, or refused to take the request (REFUSED, for MySQL
    dberrors.REFUSED), or the connection to it was lost mid-request (not a refused password:
    redis-py's authentication errors are ConnectionErrors too)."""
    if isinstance(exc, RedisAuthenticationError | RedisAuthorizationError):
        return False
    if isinstance(exc, REDIS_REFUSED) or (
        isinstance(exc, RedisResponseError) and str(exc).startswith(REDIS_REFUSED_REPLIES)
    ):
        return True
    return dberrors.connection_failed(exc) or isinstance(exc, RedisConnectionError | RedisTimeout)


@contextmanager
def _unknown_when_unreachable(ids: dict[str, int]) -> Iterator[None]:
    """A grab that found MySQL or Redis unreachable is answered OutcomeUnknown (503 with
    Retry-After), not a server error. What can be settled at once has been (the Redis
    strategies' lost replies, a COMMIT in doubt whose rows MySQL holds); what reaches here may
    or may not have taken effect as far as this process can tell, and the same user's retry
    learns which."""
    try:
        yield
    except Exception as exc:
        if not store_unreachable(exc):
            raise
        if dberrors.connection_failed(exc):
            close_old_connections()  # the broken one, for this thread's next grab
        logger.warning(
            "grab store unreachable", extra={"event": "store_unreachable", "error": exc, **ids}
        )
        raise OutcomeUnknown(
            "MySQL or Redis did not answer; retry to learn the grab's outcome"
        ) from exc


def is_lock_timeout(exc: DatabaseError) -> bool:
    """A lock wait that gave up: InnoDB's lock wait timeout or deadlock, SQLite's busy timeout."""
    return dberrors.code(exc) in dberrors.LOCK_GAVE_UP or "database is locked" in str(exc)


def activity_expire(*, activity_id: int, force: bool = False) -> expiry.RefundOutcome:
    """Close the activity and refund what is left to its sender, exactly once (expiry.refund);
    `force` does it before the expiry (the admin's "expire now")."""
    with shards.for_activity(activity_id):
        return expiry.refund(activity_id=activity_id, force=force)
