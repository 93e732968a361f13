"""preallocated, preallocated_skip_locked: packets cut at send are consumed as a multiset."""

from collections import Counter
from decimal import Decimal

import pytest

from redpack import services
from redpack.audit import audit_activity
from redpack.models import Activity, GrabDetail, Packet, PacketStatus
from redpack.money import to_cents
from strategies.base import Outcome
from tests.contract.harness import grab_concurrently

PACKETS = 30


@pytest.mark.parametrize("strategy", ["preallocated", "preallocated_skip_locked"])
@pytest.mark.django_db(transaction=True)
def test_grabs_consume_the_pre_split_packets_as_a_multiset(strategy, make_users, sender):
    users = make_users(45)
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("50.00"),
        total_count=PACKETS,
        strategy=strategy,
        allocation_kind="line_segment",
        expires_in=3600,
    )
    cut = Counter(
        to_cents(a)
        for a in Packet.objects.filter(activity=activity).values_list("amount", flat=True)
    )
    assert sum(cut.values()) == PACKETS
    assert sum(cents * n for cents, n in cut.items()) == 5000

    answers = grab_concurrently(activity.pk, [u.pk for u in users], clicks_per_user=2)

    grabbed = [
        (a.user_id, a.result.amount_cents) for a in answers if a.result.outcome is Outcome.GRABBED
    ]
    packets = Packet.objects.filter(activity=activity)
    taken = Counter(
        to_cents(a)
        for a in packets.filter(status=PacketStatus.TAKEN).values_list("amount", flat=True)
    )
    left = Counter(
        to_cents(a)
        for a in packets.filter(status=PacketStatus.AVAILABLE).values_list("amount", flat=True)
    )
    held = Counter(
        to_cents(a)
        for a in GrabDetail.objects.filter(activity=activity).values_list("amount", flat=True)
    )
    assert held == taken == Counter(cents for _, cents in grabbed)
    assert taken + left == cut  # nothing invented, nothing lost, amounts untouched
    assert not GrabDetail.objects.filter(activity=activity, redpack__isnull=True).exists()
    activity = Activity.objects.get(pk=activity.pk)
    assert activity.surplus_count == sum(left.values())
    report = audit_activity(activity, answers=grabbed)
    assert report.ok, report.violations
