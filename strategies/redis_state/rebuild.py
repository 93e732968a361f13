"""Rewrite an activity's Redis state from MySQL, the source of truth (on send, and by
`manage.py redis_rebuild` after Redis lost its data)."""

import secrets
from collections import Counter
from dataclasses import dataclass

from django.conf import settings

from redpack import shards
from redpack.models import Activity, ActivityStatus, Packet, PacketStatus
from redpack.money import to_cents

from ..lua import script
from ..steps import held_marks
from .keys import epoch_ms, mark


@dataclass
class Recorded:
    """What Redis must agree with, in Redis's terms: MySQL's grabs, packets and what is left."""

    grabs: dict[str, str]  # user id -> mark
    count: int
    cents: int
    available: Counter[str]  # packets not yet taken, as marks

    @classmethod
    def read(cls, activity: Activity) -> "Recorded":
        """MySQL's side of the activity, for a row the caller has read (and, to rebuild, locked)."""
        return cls(
            grabs={
                str(user_id): mark(row.cents, row.packet_id)
                for user_id, row in held_marks(activity_id=activity.pk).items()
            },
            count=activity.surplus_count,
            cents=to_cents(activity.surplus_amount),
            available=Counter(
                mark(to_cents(amount), packet_id)
                for packet_id, amount in Packet.objects.filter(
                    activity=activity, status=PacketStatus.AVAILABLE
                )
                .order_by("pk")
                .values_list("pk", "amount")
            ),
        )


def install(activity_id: int, keys: list[str]) -> bool:
    """(Re)write the activity's Redis state from MySQL. Idempotent.

    The activity row stays locked meanwhile: every grab's transaction updates that row, so
    none commits between reading MySQL and writing Redis. False when the script refused
    (redis_queue_async: grabs are still on their way to MySQL).
    """
    with shards.atomic():
        activity = Activity.objects.select_for_update().get(pk=activity_id)
        recorded = Recorded.read(activity)
        expires_ms = epoch_ms(activity.expires_at)
        installed = script("install")(
            keys=keys,
            args=[
                secrets.token_hex(8),
                "open" if activity.status == ActivityStatus.OPEN else "closed",
                expires_ms,
                expires_ms + settings.REDPACK_REDIS_STATE_GRACE * 1000,
                activity.allocation,
                activity.surplus_count,
                to_cents(activity.surplus_amount),
                len(recorded.grabs),
                *[part for pair in recorded.grabs.items() for part in pair],
                *recorded.available.elements(),
            ],
        )
    return bool(installed)
