"""Write a grab Redis decided to MySQL before the answer; if that fails, give Redis back what it
took (lua/release.lua), so nothing is lost and the user may retry."""

import logging

from django.db import IntegrityError, transaction
from redis.exceptions import RedisError

from ..base import GrabResult, Outcome
from ..lua import script
from ..steps import after_duplicate, claim_packet, record_grab
from .keys import Keys, parse_mark

logger = logging.getLogger(__name__)


class PacketTaken(Exception):
    """MySQL does not hold the popped packet as available (or not at that amount): Redis and
    MySQL disagreed, so the packet is not given back to the list."""


def write_grab(*, activity_id: int, user_id: int, mark_text: str, epoch: str) -> GrabResult:
    """One transaction: the surplus, the detail row and, for a pre-split packet, its claim."""
    cents, packet_id = parse_mark(mark_text)
    try:
        with transaction.atomic():
            record_grab(activity_id=activity_id, user_id=user_id, cents=cents, redpack_id=packet_id)
            if packet_id is not None and not claim_packet(
                packet_id=packet_id, user_id=user_id, cents=cents
            ):
                raise PacketTaken(packet_id)
    except PacketTaken:
        release(activity_id, user_id, mark_text, epoch, restore=False)
        logger.warning(
            "activity %s: packet %s was in Redis but is not available in MySQL; "
            "run `manage.py redis_rebuild --activity %s`",
            activity_id,
            packet_id,
            activity_id,
        )
        return GrabResult(Outcome.CONTENDED)
    except Exception as exc:
        release(activity_id, user_id, mark_text, epoch, restore=True)
        if isinstance(exc, IntegrityError):
            # MySQL knew of this user's grab although Redis did not, or the user is gone.
            return after_duplicate(activity_id=activity_id, user_id=user_id, error=exc)
        raise
    return GrabResult(Outcome.GRABBED, cents)


def release(activity_id: int, user_id: int, mark_text: str, epoch: str, *, restore: bool) -> None:
    """Remove the user's mark, and with `restore` give the amount (or packet) back, unless the
    state was rebuilt since the grab (another epoch)."""
    try:
        released = script("release")(
            keys=Keys(activity_id).ordered(),
            args=[user_id, mark_text, epoch, "restore" if restore else "forget"],
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
        logger.info("activity %s: state rebuilt since user %s grabbed", activity_id, user_id)
