"""`compare` names the background work left from before it (it would share the machine with the
runs and lower their figures), against the real Redis and MySQL."""

from decimal import Decimal

import pytest

from redpack import services
from redpack.lab.compare import backlog_before
from strategies import registry

pytestmark = pytest.mark.django_db(transaction=True)


def test_grabs_still_on_their_way_to_mysql_are_named_until_they_persist(make_users, sender):
    assert backlog_before() is None
    activity = services.activity_send(
        sender_id=sender.pk,
        total_amount=Decimal("3.00"),
        total_count=3,
        strategy="redis_queue_async",
    )
    for user in make_users(2):
        services.activity_grab(activity_id=activity.pk, user_id=user.pk)

    assert backlog_before() == "2 grabs waited to persist"

    assert registry.get("redis_queue_async").settle(activity_id=activity.pk, timeout=10)
    assert backlog_before() is None
