"""Write a grab Redis decided to MySQL before the answer; if that fails, give Redis back what it
took (lua/release.lua), so nothing is lost and the user may retry. When the write's outcome is
unknown (the connection dropped, maybe during COMMIT), MySQL is asked before anything is given
back (steps.written_row): a grab that committed is answered `grabbed`, never undone."""

import logging

from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from redis.exceptions import RedisError

from ..base import GrabResult, Outcome
from ..lua import script
from ..steps import GrabRow, after_duplicate, claim_packet, held_marks, record_grab, written_row
from .keys import Keys, parse_mark

logger = logging.getLogger(__name__)


class PacketTaken(Exception):
    """MySQL does not hold the popped packet as available (or not at that amount): Redis and
    MySQL disagreed, so the packet is not given back to the list."""


def write_grab(
    *,
    activity_id: int,
    user_id: int,
    mark_text: str,
    epoch: str,
    attempt: str,
    adopted: bool = False,
) -> GrabResult:
    """One transaction: the surplus, the detail row and, for a pre-split packet, its claim.

    `adopted`: this attempt writes a grab an earlier attempt of the user made (adopt()), so
    it answers `already_grabbed`; the attempt that made the grab is the one that says
    `grabbed`, and a user is told `grabbed` once.
    """
    cents, packet_id = parse_mark(mark_text)
    this_grab = GrabRow(user_id, cents, packet_id)
    won = GrabResult(Outcome.ALREADY_GRABBED if adopted else Outcome.GRABBED, cents)
    try:
        with transaction.atomic():
            record_grab(activity_id=activity_id, user_id=user_id, cents=cents, redpack_id=packet_id)
            if packet_id is not None and not claim_packet(
                packet_id=packet_id, user_id=user_id, cents=cents
            ):
                raise PacketTaken(packet_id)
    except PacketTaken:
        release(activity_id, user_id, mark_text, epoch, attempt, restore=False)
        logger.warning(
            "activity %s: packet %s was in Redis but is not available in MySQL; "
            "run `manage.py redis_rebuild --activity %s`",
            activity_id,
            packet_id,
            activity_id,
        )
        return GrabResult(Outcome.CONTENDED)
    except IntegrityError as exc:
        held = held_marks(activity_id=activity_id, user_ids=[user_id]).get(user_id)
        if held == this_grab:
            # Another attempt of this user wrote this very grab (it took the mark over, or it
            # made it and this one took it over): one row, and it is this one.
            return won
        release(activity_id, user_id, mark_text, epoch, attempt, restore=True)
        # MySQL knew of this user's grab although Redis did not, or the user is gone.
        return after_duplicate(activity_id=activity_id, user_id=user_id, error=exc)
    except Exception as exc:
        return after_failed_write(activity_id, this_grab, mark_text, epoch, attempt, exc, won)
    return won


def after_failed_write(
    activity_id: int,
    grab: GrabRow,
    mark_text: str,
    epoch: str,
    attempt: str,
    exc: Exception,
    won: GrabResult,
) -> GrabResult:
    """The transaction raised: rolled back, or, if the connection dropped during COMMIT, maybe
    committed. Outcome unknown until MySQL says which (written_row; OutcomeUnknown when it
    cannot be asked: Redis keeps the mark and the user's retry converges on it)."""
    held = written_row(activity_id=activity_id, user_id=grab.user_id)
    if held == grab:
        logger.warning(
            "activity %s: user %s's grab committed although its reply was lost (%s)",
            activity_id,
            grab.user_id,
            exc,
        )
        return won
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
