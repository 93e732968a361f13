"""Packets cut at send time, each claimed by compare-and-set (seed 001, 预先分配红包 + 乐观锁).

What it locks: nothing while choosing. Sending splits the total into `t_redpack` rows; a grab
picks one available row at random (so rivals rarely pick the same one), then in one
transaction locks the activity row, claims the packet with
`UPDATE t_redpack … WHERE id=? AND status=AVAILABLE AND version=?`, decrements the surplus and
inserts the detail pointing at the packet. The activity row is locked before the claim, so
that open, unexpired and surplus left are checked under it before anything is written (the
claim itself takes no lock on the row: the packets' foreign key has an index of its own,
migration 0006; strategies/steps.py, "Lock order").
What it checks twice: open / already grabbed / sold out on a plain read, then all three again
under the activity row lock (a twin click may have taken a packet meanwhile: `already_grabbed`,
not `sold_out`); if closed, nothing is written and the answer is `closed`.
Round trips per attempt: 2 reads (the activity with the user's own grab, then the random
packet: a range read from a random pivot, see `random_available`), then START TRANSACTION with
SELECT … FOR UPDATE (one query), UPDATE packet + UPDATE activity + INSERT detail + COMMIT.
Failure mode: the pick is made before the lock, so two grabs can pick the same packet; the
loser rolls back and picks again, up to REDPACK_PREALLOCATED_MAX_RETRIES times. Near the end
few packets remain, picks collide, and some grabbers are turned away with `contended`. The
activity row still serialises the short claim transaction of every grab.
"""

import random
from decimal import Decimal
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import IntegrityError
from django.db.models import Max, Min

from redpack import shards
from redpack.models import Activity, Packet, PacketStatus
from redpack.money import to_cents
from redpack.shards import connection

from .base import CloseResult, GrabResult, GrabStrategy, Outcome
from .retry import attempts
from .steps import (
    GrabRow,
    Statement,
    after_duplicate,
    claim_packet,
    claim_packet_sql,
    close_row_locked,
    execute_raw,
    grab_transaction,
    read_for_grab,
    read_for_grab_sql,
    record_grab,
    record_grab_raw,
    refusal,
    split_into_packets,
)


class PreallocatedStrategy(GrabStrategy):
    name = "preallocated"
    label = "pre-split packets, compare-and-set"
    tradeoff = "Packets cut at send; a grab claims a random one, retries if it lost the race."

    def prepare(self, activity: Activity) -> None:
        split_into_packets(activity)

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        for _ in attempts(settings.REDPACK_PREALLOCATED_MAX_RETRIES):
            activity, held = read_for_grab(activity_id=activity_id, user_id=user_id, lock=False)
            answer = refusal(activity, user_id=None, held=held)
            if answer is not None:
                return answer
            picked = random_available(activity_id, 1)
            if not picked:
                continue  # the surplus read was stale; count it as a lost race
            [(packet_id, version, amount)] = picked
            try:
                with grab_transaction(turn=activity_id, ask_known=True):
                    # The user's grab again, under the lock: a twin click may have taken a
                    # packet since the plain read (then `already_grabbed`, not `sold_out`).
                    locked, held = read_for_grab(activity_id=activity_id, user_id=user_id)
                    answer = refusal(locked, user_id=None, held=held)
                    if answer is not None:
                        return answer
                    if not claim_packet(packet_id=packet_id, version=version, user_id=user_id):
                        continue  # someone claimed it since the pick; nothing was written
                    cents = to_cents(amount)
                    record_grab(
                        activity_id=activity_id, user_id=user_id, cents=cents, redpack_id=packet_id
                    )
                    return GrabResult(Outcome.GRABBED, cents)
            except IntegrityError as exc:
                return after_duplicate(activity_id=activity_id, user_id=user_id, error=exc)
        return GrabResult(Outcome.CONTENDED)

    def close(self, *, activity_id: int) -> CloseResult:
        with shards.atomic():
            return close_row_locked(activity_id=activity_id)

    def raw_grab(self, cursor: Any, *, activity_id: int, user_id: int) -> None:
        """grab()'s statements on a plain cursor: the plain read, a pick, the claim
        transaction (a lost claim picks again)."""
        cursor.execute(*read_for_grab_sql(activity_id=activity_id, user_id=user_id, lock=False))
        while True:
            pivot = random_pivot(activity_id)
            assert pivot is not None
            cursor.execute(*random_available_sql(activity_id=activity_id, pivot=pivot, size=1))
            packet_id, version, amount = cursor.fetchone()
            lock = read_for_grab_sql(activity_id=activity_id, user_id=user_id, lock=True)
            execute_raw(cursor, lock, begin=True)
            cursor.execute(*claim_packet_sql(packet_id=packet_id, user_id=user_id, version=version))
            if cursor.rowcount == 1:
                break
            cursor.execute("COMMIT")  # lost the race: nothing written, pick again
        row = GrabRow(user_id, to_cents(amount), packet_id)
        record_grab_raw(cursor, activity_id=activity_id, row=row)
        cursor.execute("COMMIT")


def random_available(activity_id: int, size: int) -> list[tuple[int, int, Decimal]]:
    """(id, version, amount) of up to `size` available packets in id order, from a random
    point of the activity's id range on, wrapping around.

    Range reads on the (activity, status) index from a random pivot, not an OFFSET, which
    reads every row it skips (tens of milliseconds of MySQL per pick on 100,000 packets); on
    MySQL both ranges in one raw statement. A packet right after a run of taken ones is picked
    a little more often; the pick only has to spread rivals apart. A plain read, on purpose: a
    locking range scan of (activity_id, status) would also lock the entry just past its range,
    a taken packet's, which the next claim has to rewrite.
    """
    pivot = random_pivot(activity_id)
    if pivot is None:
        return []
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(*random_available_sql(activity_id=activity_id, pivot=pivot, size=size))
            return list(cursor.fetchall())
    available = Packet.objects.filter(
        activity_id=activity_id, status=PacketStatus.AVAILABLE
    ).order_by("id")
    fields = ("id", "version", "amount")
    picked = list(available.filter(pk__gte=pivot).values_list(*fields)[:size])
    if len(picked) < size:
        picked += available.filter(pk__lt=pivot).values_list(*fields)[: size - len(picked)]
    return picked


def random_pivot(activity_id: int) -> int | None:
    """A random id in the activity's packet id range (None: it has no packets)."""
    span = packet_id_span(activity_id)
    return None if span is None else random.randint(*span)


def random_available_sql(*, activity_id: int, pivot: int, size: int) -> Statement:
    """`random_available`'s statement on MySQL: both ranges, by the (activity, status) index."""
    side = (
        f"(SELECT id, version, amount FROM {Packet._meta.db_table}"
        " FORCE INDEX (packet_activity_status)"
        " WHERE activity_id = %s AND status = %s AND id {} %s ORDER BY id LIMIT %s)"
    )
    return (
        f"SELECT id, version, amount FROM ({side.format('>=')} UNION ALL"
        f" {side.format('<')}) AS around ORDER BY id < %s, id LIMIT %s",
        [activity_id, PacketStatus.AVAILABLE.value, pivot, size] * 2 + [pivot, size],
    )


@lru_cache(maxsize=4096)
def packet_id_span(activity_id: int) -> tuple[int, int] | None:
    """The lowest and highest id of the activity's packets, read once per process (they never
    change after the send); None for an activity without packets. A stale span (an id reused
    by a test database) only makes the pick less random: `random_available` wraps around."""
    span = Packet.objects.filter(activity_id=activity_id).aggregate(low=Min("id"), high=Max("id"))
    if span["low"] is None:
        return None
    return span["low"], span["high"]
