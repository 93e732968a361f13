"""Pre-split packets claimed with SELECT … FOR UPDATE SKIP LOCKED (MariaDB ≥ 10.6, MySQL ≥ 8).

What it locks: one packet row that no other transaction holds. A plain read lists a window of
available packets from a random start; `SELECT … WHERE id IN (window) AND status=AVAILABLE
… LIMIT 1 FOR UPDATE SKIP LOCKED` then locks the first of them nobody holds, so concurrent
grabs each get a different row without colliding or waiting. (The locking read goes by primary
key on purpose: a SKIP LOCKED range scan of the (activity_id, status) index also locks the
entry past its range, and under a few hundred concurrent grabs MariaDB then chains waits and
deadlocks with the claims that rewrite those entries.) Then, in the same transaction: the
surplus decrement, conditional on the activity being open and unexpired (else nothing is
written and the answer is `closed`), the detail insert, the packet marked taken, commit.
A locking read takes no foreign-key lock, so holding the packet before the activity row keeps
the lock order of strategies/db.py.
What it checks twice: open / already grabbed / sold out on a plain read, then open and
unexpired again in the decrement.
Round trips: 3 reads, then SELECT … SKIP LOCKED + UPDATE activity + INSERT + UPDATE packet +
COMMIT. No lost races, no retry storm: when every packet of its window is held by grabs in
flight (near the end), a grab waits inside MySQL for one of them and takes it if its holder
rolled back (a double click), else looks again, up to REDPACK_PREALLOCATED_MAX_RETRIES times.
Failure mode: grabs still queue on the activity row's decrement while holding their packet, so
it cannot be faster than that row's hand-off; needs SKIP LOCKED (MariaDB ≥ 10.6, MySQL ≥ 8).
"""

import random

from django.conf import settings
from django.db import IntegrityError, transaction

from redpack.models import Activity, Packet, PacketStatus
from redpack.money import to_cents

from .base import GrabResult, Outcome, refusal
from .db import already_grabbed, claim_packet, existing_cents, record_grab
from .preallocated import PreallocatedStrategy, random_available

# Candidates per attempt: enough that grabs in flight rarely cover all of them.
WINDOW = 16


class SkipLockedStrategy(PreallocatedStrategy):
    name = "preallocated_skip_locked"
    label = "pre-split packets, FOR UPDATE SKIP LOCKED"
    tradeoff = "Each grab locks a packet nobody else holds: no lost races; needs SKIP LOCKED."

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        for _ in range(settings.REDPACK_PREALLOCATED_MAX_RETRIES + 1):
            activity = Activity.objects.get(pk=activity_id)
            answer = refusal(activity, existing_cents(activity_id=activity_id, user_id=user_id))
            if answer is not None:
                return answer
            window = list(random_available(activity, WINDOW).values_list("id", flat=True))
            try:
                with transaction.atomic():
                    packet = (
                        Packet.objects.select_for_update(skip_locked=True)
                        .filter(pk__in=window, status=PacketStatus.AVAILABLE)
                        .order_by("id")
                        .only("id", "version", "amount")
                        .first()
                    )
                    if packet is None and window:
                        # Every packet of the window is held by a grab in flight: wait in MySQL
                        # for one of them (no spinning) and take it if its holder rolled back.
                        packet = (
                            Packet.objects.select_for_update()
                            .filter(pk=random.choice(window), status=PacketStatus.AVAILABLE)
                            .only("id", "version", "amount")
                            .first()
                        )
                    if packet is None:
                        continue
                    cents = to_cents(packet.amount)
                    if not record_grab(
                        activity_id=activity_id,
                        user_id=user_id,
                        cents=cents,
                        open_only=True,
                        redpack_id=packet.pk,
                    ):
                        return GrabResult(Outcome.CLOSED)
                    # Cannot lose: the row is locked by this transaction.
                    claim_packet(packet_id=packet.pk, version=packet.version, user_id=user_id)
                    return GrabResult(Outcome.GRABBED, cents)
            except IntegrityError:
                return already_grabbed(activity_id=activity_id, user_id=user_id)
        return GrabResult(Outcome.CONTENDED)
