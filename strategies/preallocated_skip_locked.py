"""Pre-split packets claimed with SELECT … FOR UPDATE SKIP LOCKED (MariaDB ≥ 10.6, MySQL ≥ 8).

What it locks: one packet row that no other transaction holds. A plain read lists a window of
available packets from a random start; `SELECT … WHERE id IN (window) AND status=AVAILABLE
… LIMIT 1 FOR UPDATE SKIP LOCKED` locks the first of them nobody holds, so concurrent grabs
each get a different row without colliding, waiting or retrying. (The locking read goes by
primary key on purpose: a SKIP LOCKED range scan of the (activity_id, status) index also locks
the entry past its range, and under a few hundred concurrent grabs MariaDB then chains waits
and deadlocks with the claims that rewrite those entries.) Then, in the same transaction: the
surplus decrement, conditional on the activity being open and unexpired (else nothing is
written and the answer is `closed`), the detail insert, the packet marked taken, commit.
A locking read takes no foreign-key lock, so holding the packet before the activity row keeps
the lock order of strategies/steps.py.
What it checks twice: open / already grabbed / sold out on a plain read, then open and
unexpired again in the decrement (and all three again under the activity row lock when no
packet of the window was free: a twin click may have taken the last packet meanwhile).
Round trips: 2 reads (the activity with the user's grab, the window), then START TRANSACTION with
SELECT … SKIP LOCKED (one query), UPDATE activity + INSERT + UPDATE packet +
COMMIT. Near the end every remaining packet may be held by grabs queued on the activity row;
a grab that finds its window held queues there too (a wait in MySQL, not a retry loop) and
looks again, at all the packets, once the grabs ahead of it are done.
Failure mode: grabs still queue on the activity row's decrement, so it is no faster than that
row's hand-off; a grab whose second look finds every packet held by grabs queued behind it
answers `contended` (they may still roll back). Older MySQL/MariaDB lack SKIP LOCKED.
"""

from decimal import Decimal
from typing import Any

from django.db import IntegrityError

from redpack.models import Packet, PacketStatus
from redpack.money import to_cents
from redpack.shards import connection

from .base import GrabResult, Outcome
from .preallocated import (
    PreallocatedStrategy,
    random_available,
    random_available_sql,
    random_pivot,
)
from .steps import (
    GrabRow,
    Statement,
    after_duplicate,
    claim_packet,
    claim_packet_sql,
    execute_raw,
    grab_transaction,
    read_for_grab,
    read_for_grab_sql,
    record_grab,
    record_grab_raw,
    refusal,
)

# Candidates per attempt: enough that grabs in flight rarely cover all of them.
WINDOW = 16


class SkipLockedStrategy(PreallocatedStrategy):
    name = "preallocated_skip_locked"
    label = "pre-split packets, FOR UPDATE SKIP LOCKED"
    tradeoff = "Each grab locks a packet nobody else holds: no lost races; needs SKIP LOCKED."
    requires = frozenset({"mysql"})  # SQLite has no row locks to skip

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        activity, held = read_for_grab(activity_id=activity_id, user_id=user_id, lock=False)
        answer = refusal(activity, user_id=None, held=held)
        if answer is not None:
            return answer
        window = [packet_id for packet_id, _, _ in random_available(activity_id, WINDOW)]
        try:
            with grab_transaction(turn=activity_id, ask_known=True):
                packet = _lock_first_free(*in_window(window)) if window else None
                if packet is None:
                    # Every packet of the window is held by a grab in flight. Queue on the
                    # activity row like those grabs (a wait in MySQL, not a retry loop); once
                    # it is ours, whoever was ahead has committed or rolled back, and nobody
                    # else can claim, so scanning all the activity's packets is safe. The
                    # user's grab is read again with it: a twin click may have just taken
                    # the last packet, and this one then hears `already_grabbed`.
                    locked, held = read_for_grab(activity_id=activity_id, user_id=user_id)
                    answer = refusal(locked, user_id=None, held=held)
                    if answer is not None:
                        return answer
                    packet = _lock_first_free("activity_id = %s", [activity_id])
                    if packet is None:
                        return GrabResult(Outcome.CONTENDED)  # all held by grabs queued behind
                packet_id, version, amount = packet
                cents = to_cents(amount)
                if not record_grab(
                    activity_id=activity_id,
                    user_id=user_id,
                    cents=cents,
                    open_only=True,
                    redpack_id=packet_id,
                ):
                    return GrabResult(Outcome.CLOSED)
                # Cannot lose: the row is locked by this transaction.
                claim_packet(packet_id=packet_id, version=version, user_id=user_id)
                return GrabResult(Outcome.GRABBED, cents)
        except IntegrityError as exc:
            return after_duplicate(activity_id=activity_id, user_id=user_id, error=exc)

    def raw_grab(self, cursor: Any, *, activity_id: int, user_id: int) -> None:
        """grab()'s statements on a plain cursor: the plain read, a window, one
        transaction that locks a free packet of it (or, all held, any after the row lock)."""
        cursor.execute(*read_for_grab_sql(activity_id=activity_id, user_id=user_id, lock=False))
        pivot = random_pivot(activity_id)
        assert pivot is not None
        cursor.execute(*random_available_sql(activity_id=activity_id, pivot=pivot, size=WINDOW))
        window = [row[0] for row in cursor.fetchall()]
        execute_raw(cursor, lock_first_free_sql(*in_window(window)), begin=True)
        packet = cursor.fetchone()
        if packet is None:
            cursor.execute(*read_for_grab_sql(activity_id=activity_id, user_id=user_id, lock=True))
            cursor.execute(*lock_first_free_sql("activity_id = %s", [activity_id]))
            packet = cursor.fetchone()
        packet_id, version, amount = packet
        row = GrabRow(user_id, to_cents(amount), packet_id)
        record_grab_raw(cursor, activity_id=activity_id, row=row, open_only=True)
        cursor.execute(*claim_packet_sql(packet_id=packet_id, user_id=user_id, version=version))
        cursor.execute("COMMIT")


def in_window(window: list[int]) -> tuple[str, list[int]]:
    """The condition and parameters of `_lock_first_free` for these packet ids."""
    return f"id IN ({', '.join(['%s'] * len(window))})", window


def _lock_first_free(where: str, params: list[int]) -> tuple[int, int, Decimal] | None:
    """(id, version, amount) of the first available packet matching `where` that no other
    transaction holds, locked, in one raw statement."""
    with connection.cursor() as cursor:
        cursor.execute(*lock_first_free_sql(where, params))
        return cursor.fetchone()


def lock_first_free_sql(where: str, params: list[int]) -> Statement:
    """`_lock_first_free`'s statement (FOR UPDATE SKIP LOCKED)."""
    return (
        f"SELECT id, version, amount FROM {Packet._meta.db_table}"
        f" WHERE {where} AND status = %s ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
        [*params, PacketStatus.AVAILABLE.value],
    )
