"""A twin click that takes the last packet while its sibling is between its plain read and its
write: the sibling answers `already_grabbed` with the twin's amount, never `sold_out`.

The MySQL strategies that read the activity without a lock first (optimistic, preallocated,
preallocated_skip_locked) look at the user's grab again when they look again: the twin is
run, on its own connection, at the exact point after the sibling's plain read."""

import threading
from decimal import Decimal

import pytest
from django.db import connections

from redpack import services
from redpack.models import GrabDetail
from redpack.money import to_cents
from strategies import optimistic, preallocated, preallocated_skip_locked, registry
from strategies.base import GrabResult, Outcome

# Per strategy: the module and the name of a call it makes after its plain read and before
# its write (for the pre-splitting ones, the pick of packets; for optimistic, the draw).
AFTER_THE_PLAIN_READ = {
    "optimistic": (optimistic.allocation, "draw"),
    "preallocated": (preallocated, "random_available"),
    "preallocated_skip_locked": (preallocated_skip_locked, "random_available"),
}


@pytest.mark.parametrize("strategy", sorted(AFTER_THE_PLAIN_READ))
@pytest.mark.django_db(transaction=True)
def test_a_twin_that_took_the_last_packet_is_answered_already_grabbed(
    strategy, make_users, sender, monkeypatch, settings
):
    settings.REDPACK_OPTIMISTIC_MAX_RETRIES = 3  # optimistic looks again on its retry
    [user] = make_users(1)
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("1.23"),
        total_count=1,
        strategy=strategy,
        expires_in=3600,
    )
    grab = registry.get(strategy).grab
    module, name = AFTER_THE_PLAIN_READ[strategy]
    original = getattr(module, name)
    first_caller = threading.get_ident()
    twin: list[GrabResult | BaseException] = []

    def twin_click() -> None:
        try:
            twin.append(grab(activity_id=activity.pk, user_id=user.pk))
        except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
            twin.append(exc)
        finally:
            connections.close_all()

    def then_the_twin(*args, **kwargs):
        picked = original(*args, **kwargs)
        if threading.get_ident() == first_caller and not twin:
            thread = threading.Thread(target=twin_click)
            thread.start()
            thread.join(timeout=60)
            assert not thread.is_alive(), "the twin waits for the sibling: a lock held here"
        return picked

    monkeypatch.setattr(module, name, then_the_twin)

    sibling = grab(activity_id=activity.pk, user_id=user.pk)

    assert twin == [GrabResult(Outcome.GRABBED, 123)]
    assert sibling == GrabResult(Outcome.ALREADY_GRABBED, 123)
    rows = GrabDetail.objects.filter(activity=activity)
    assert [(r.user_id, to_cents(r.amount)) for r in rows] == [(user.pk, 123)]
