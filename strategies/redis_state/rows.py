"""Write the grabs Redis decided to MySQL before the answer; if that fails, give Redis back what
it took (lua/release.lua), so nothing is lost and the user may retry. A batch (one script run
for many users) is written by group commit, one transaction (`write_grabs`); should that fail,
each grab is written on its own (`write_grab`), which settles whatever the failure left. When
the write's outcome is unknown (the connection dropped, maybe during COMMIT), MySQL is asked
before anything is given back (steps.written_row): a grab that committed is answered `grabbed`,
never undone."""

import logging
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, InterfaceError, OperationalError
from redis.exceptions import RedisError

from redpack.errors import OutcomeUnknown
from redpack.shards import connection

from .. import turns
from ..base import GrabResult, Outcome
from ..lua import script
from ..steps import (
    GrabRow,
    after_duplicate,
    commit_grabs_raw,
    grab_transaction,
    held_marks,
    record_grabs,
    written_row,
)
from .keys import Keys, parse_mark

logger = logging.getLogger(__name__)


class PacketTaken(Exception):
    """MySQL does not hold the popped packet as available (or not at that amount): Redis and
    MySQL disagreed, so the packet is not given back to the list."""

    @classmethod
    def among(cls, rows: list[GrabRow]) -> "PacketTaken":
        """A batch's claim fell short: one of its pre-split packets, named by their ids."""
        return cls([row.packet_id for row in rows if row.packet_id is not None])


@dataclass(frozen=True)
class Won:
    """A grab a script run decided for a user, to be written to MySQL."""

    user_id: int
    attempt: str
    mark: str
    epoch: str


def write_grabs(*, activity_id: int, grabs: list[Won]) -> list[GrabResult | Exception]:
    """Group commit: the grabs of one script run in one transaction (one UPDATE claiming their
    packets, the surplus once, one multi-row INSERT: steps.record_grabs), one answer per grab,
    in order.

    One transaction, so after a failure either every row exists or none does. Whatever the
    failure (a duplicate MySQL knew of, a packet MySQL does not hold, a dropped connection,
    maybe during COMMIT), each grab is then written on its own by `write_grab`, which answers it
    from what MySQL holds and gives back to Redis what was not written. When MySQL cannot be
    asked at all, every grab not yet answered gets OutcomeUnknown and keeps its mark in Redis.
    """
    if len(grabs) > 1:
        rows = [GrabRow(grab.user_id, *parse_mark(grab.mark)) for grab in grabs]
        try:
            with grab_transaction() as transaction:
                if not record_grabs(activity_id=activity_id, rows=rows, commit=transaction):
                    raise PacketTaken.among(rows)
        except Exception as exc:  # noqa: BLE001 - settled grab by grab below
            logger.info(
                "activity %s: a batch of %d grabs was not written at once (%r); "
                "writing them one by one",
                activity_id,
                len(grabs),
                exc,
            )
            connection.close_if_unusable_or_obsolete()
        else:
            return [GrabResult(Outcome.GRABBED, row.cents) for row in rows]
    answers: list[GrabResult | Exception] = []
    for grab in grabs:
        try:
            answers.append(
                write_grab(
                    activity_id=activity_id,
                    user_id=grab.user_id,
                    mark_text=grab.mark,
                    epoch=grab.epoch,
                    attempt=grab.attempt,
                )
            )
        except OutcomeUnknown as exc:
            answers += [exc] * (len(grabs) - len(answers))  # MySQL cannot be asked
            break
        except Exception as exc:  # noqa: BLE001 - this grab's answer (e.g. 403), not the others'
            answers.append(exc)
    return answers


def write_grabs_raw(
    cursor: Any, *, activity_id: int, grabs: list[tuple[int, int, int | None]]
) -> None:
    """`write_grabs`' transaction for a batch, on a plain cursor (autocommit) without Django:
    the lab's batched raw same-SQL ceiling (GrabStrategy.raw_batch). `grabs`: (user id, cents,
    packet id or None), as Redis would have decided them."""
    rows = [GrabRow(*grab) for grab in grabs]
    try:
        if not commit_grabs_raw(cursor, activity_id=activity_id, rows=rows, begin=True):
            raise PacketTaken.among(rows)
    except BaseException:
        cursor.execute("ROLLBACK")
        raise


def write_grab(
    *,
    activity_id: int,
    user_id: int,
    mark_text: str,
    epoch: str,
    attempt: str,
    adopted: bool = False,
) -> GrabResult:
    """One transaction: for a pre-split packet its claim, then the surplus and the detail row
    (steps.record_grabs, as a batch of one).

    `adopted`: this attempt writes a grab an earlier attempt of the user made (adopt()), so
    it answers `already_grabbed`; the attempt that made the grab is the one that says
    `grabbed`, and a user is told `grabbed` once.
    """
    cents, packet_id = parse_mark(mark_text)
    this_grab = GrabRow(user_id, cents, packet_id)
    won = GrabResult(Outcome.ALREADY_GRABBED if adopted else Outcome.GRABBED, cents)
    try:
        with grab_transaction(turn=activity_id) as transaction:
            if not record_grabs(activity_id=activity_id, rows=[this_grab], commit=transaction):
                raise PacketTaken(packet_id)
    except (PacketTaken, IntegrityError) as exc:
        held = held_marks(activity_id=activity_id, user_ids=[user_id]).get(user_id)
        if held == this_grab:
            # Another attempt of this user wrote this very grab (a batch whose COMMIT reply was
            # lost, an attempt that took the mark over, or one this attempt took it over from):
            # one row, and it is this one. The claim comes first (steps.record_grabs), so such a
            # row shows as a taken packet or, for a drawn amount, as a duplicate row.
            return won
        if isinstance(exc, IntegrityError):
            release(activity_id, user_id, mark_text, epoch, attempt, restore=True)
            # MySQL knew of this user's grab although Redis did not, or the user is gone.
            return after_duplicate(activity_id=activity_id, user_id=user_id, error=exc)
        release(activity_id, user_id, mark_text, epoch, attempt, restore=False)
        if held is not None:  # MySQL holds another grab of this user: that one is the answer
            return GrabResult(Outcome.ALREADY_GRABBED, held.cents)
        logger.warning(
            "activity %s: packet %s was in Redis but is not available in MySQL; "
            "run `manage.py redis_rebuild --activity %s`",
            activity_id,
            packet_id,
            activity_id,
        )
        return GrabResult(Outcome.CONTENDED)
    except Exception as exc:
        return after_failed_write(
            activity_id, this_grab, mark_text, epoch, attempt, exc, won, adopted=adopted
        )
    return won


def after_failed_write(
    activity_id: int,
    grab: GrabRow,
    mark_text: str,
    epoch: str,
    attempt: str,
    exc: Exception,
    won: GrabResult,
    *,
    adopted: bool = False,
) -> GrabResult:
    """The transaction raised: rolled back, or, if the connection dropped during COMMIT, maybe
    committed. Outcome unknown until MySQL says which (written_row; OutcomeUnknown when it
    cannot be asked: Redis keeps the mark and the user's retry converges on it). A transaction
    that never got its turn (turns.NoTurn) sent nothing: MySQL is not asked.

    Not written, the mark is given back; unless this attempt took it over (`adopted`) from an
    earlier one, which may still be on its way to MySQL (stalled, paused: why the mark was taken
    over) and commit the same grab after this answer: then Redis keeps the mark, OutcomeUnknown,
    and the user's retry takes it over again and writes it, or finds it written."""
    nothing_sent = isinstance(exc, turns.NoTurn)
    held = None if nothing_sent else written_row(activity_id=activity_id, user_id=grab.user_id)
    if held == grab:
        logger.warning(
            "activity %s: user %s's grab committed although its reply was lost (%s)",
            activity_id,
            grab.user_id,
            exc,
        )
        return won
    if adopted and held is None:
        logger.warning(
            "activity %s: user %s's grab, taken over, not written (%r): its mark stays",
            activity_id,
            grab.user_id,
            exc,
        )
        raise OutcomeUnknown(
            "the grab's earlier attempt may still be writing it; retry to learn the outcome"
        ) from exc
    release(activity_id, grab.user_id, mark_text, epoch, attempt, restore=True)
    if held is not None:
        return GrabResult(Outcome.ALREADY_GRABBED, held.cents)
    if isinstance(exc, OperationalError | InterfaceError):
        # Proven not written (a lost connection, a deadlock, a lock wait timeout): nothing was
        # granted and Redis has it back, so the honest answer is "try again".
        logger.warning("activity %s: grab not written (%s)", activity_id, exc)
        return GrabResult(Outcome.CONTENDED)
    raise exc


def release(
    activity_id: int, user_id: int, mark_text: str, epoch: str, attempt: str, *, restore: bool
) -> None:
    """Remove the user's mark, and with `restore` give the amount (or packet) back, unless the
    state was rebuilt since the grab (another epoch) or a later attempt took the mark over."""
    try:
        released = script("release")(
            keys=Keys(activity_id).ordered(),
            args=[user_id, mark_text, epoch, "restore" if restore else "forget", attempt],
        )
    except RedisError:
        logger.exception(
            "activity %s: the failed grab of user %s is still held in Redis; "
            "run `manage.py redis_rebuild --activity %s`",
            activity_id,
            user_id,
            activity_id,
        )
        return
    if not released:
        logger.info(
            "activity %s: state rebuilt or mark taken over since user %s grabbed",
            activity_id,
            user_id,
        )
