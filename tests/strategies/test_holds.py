"""The row-lock hold meter (strategies/holds.py) counts the grab transactions that locked the
activity row, and only those."""

from decimal import Decimal

import pytest

from redpack import services
from strategies import holds


@pytest.mark.django_db(transaction=True)
def test_each_grab_transaction_that_locks_the_row_counts_one_hold(make_users, sender):
    users = make_users(3)
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("2.00"),
        total_count=2,
        strategy="pessimistic",
        expires_in=3600,
    )
    holds.reset_holds()

    answers = [services.activity_grab(activity_id=activity.pk, user_id=u.pk) for u in users]

    counted = holds.holds()
    assert [a.outcome.value for a in answers] == ["grabbed", "grabbed", "sold_out"]
    assert counted.transactions == 3  # sold_out was decided under the lock too
    assert counted.seconds >= counted.longest > 0


def test_a_row_taken_outside_a_grab_transaction_is_not_counted():
    holds.reset_holds()
    holds.taken()  # e.g. the persister's own transaction: no grab transaction began
    holds.released()
    assert holds.holds().transactions == 0
