"""Crediting yields to a burst of grabs (redpack/credit_pace.py), on the real MariaDB and Redis,
through the Celery task's own function. The previous look at the grab rows is written into
Redis as if taken a second ago, with as many rows fewer as the case needs: the rate the task
then reads is those rows over that second (and the few milliseconds of the test)."""

import json
import time

import pytest
from django_redis import get_redis_connection

from redpack import credit_pace, ledger, tasks
from redpack.credit_pace import LOOK_KEY, WAITING_KEY
from redpack.models import JournalEntry

from .test_ledger import grab_each, send

pytestmark = pytest.mark.django_db

FAST = 10_000  # grab rows "written" in the second before the look: far above the yield rate


def looked_a_second_ago(written: int) -> None:
    """The previous look, as if taken one second ago with `written` grab rows fewer than now."""
    before = {alias: top - written for alias, top in credit_pace._highest_ids().items()}
    client = get_redis_connection("default")
    client.delete(LOOK_KEY)
    client.hset(LOOK_KEY, mapping={"at": time.time() - 1, "ids": json.dumps(before)})


def pending() -> int:
    return int(ledger.crediting_lag()["pending"])


def test_the_rate_is_the_grab_rows_written_since_the_last_look(sender, make_users):
    looked_a_second_ago(0)
    grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    rate = credit_pace.grab_rate(get_redis_connection("default"))
    assert rate is not None and 0 < rate <= 3  # three rows in a second and a little


def test_crediting_waits_while_grabs_come_fast_then_credits_once_they_slow(sender, make_users):
    told = grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    looked_a_second_ago(FAST)
    assert tasks.credit_grabs() == 0
    assert pending() == len(told) == 3
    assert get_redis_connection("default").exists(WAITING_KEY)

    looked_a_second_ago(0)
    assert tasks.credit_grabs() == 3
    assert pending() == 0
    assert not get_redis_connection("default").exists(WAITING_KEY)


def test_crediting_waits_no_longer_than_max_wait_then_may_wait_again(sender, make_users, settings):
    settings.REDPACK_CREDIT_MAX_WAIT = 60
    activity = send(sender, "10.00", 5)
    grab_each(activity, make_users(3, prefix="first", balance="0"))
    client = get_redis_connection("default")
    client.set(WAITING_KEY, time.time() - 61)  # it began to wait 61 s ago
    looked_a_second_ago(FAST)
    assert tasks.credit_grabs() == 3  # overdue: credited although grabs still come fast
    assert not client.exists(WAITING_KEY)

    grab_each(activity, make_users(2, prefix="second", balance="0"))
    looked_a_second_ago(FAST)
    assert tasks.credit_grabs() == 0  # the next fast look waits anew
    assert pending() == 2


def test_a_run_begun_in_a_quiet_moment_stops_when_a_burst_begins(sender, make_users):
    grab_each(send(sender, "10.00", 5), make_users(5, balance="0"))
    asked = []

    def burst_begins() -> bool:
        asked.append(True)
        looked_a_second_ago(FAST)
        return credit_pace.burst_began()

    assert ledger.grabs_credit(batch=2, run_seconds=600, stop=burst_begins) == 2
    assert asked == [True]  # asked after the first transaction, not before it
    assert pending() == 3
    assert JournalEntry.objects.filter(kind="credit").count() == 2


def test_a_yield_rate_of_zero_never_waits(sender, make_users, settings):
    settings.REDPACK_CREDIT_YIELD_RATE = 0
    grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    looked_a_second_ago(FAST)
    assert tasks.credit_grabs() == 3


def test_without_redis_crediting_does_not_wait(sender, make_users, redis_proxy):
    grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    looked_a_second_ago(FAST)
    redis_proxy.cut()
    assert credit_pace.verdict() == credit_pace.QUIET
    assert tasks.credit_grabs() == 3
