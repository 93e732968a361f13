"""Crediting yields to a burst of grabs (redpack/credit_pace.py), on the real MariaDB and Redis,
through the Celery task's own function. The previous look at the grab rows is written into
Redis as if taken a second ago, with as many rows fewer as the case needs: the rate the task
then reads is those rows over that second (and the few milliseconds of the test)."""

import json
from unittest import mock

import pytest
from django.db import DatabaseError
from django_redis import get_redis_connection

from redpack import credit_pace, ledger, tasks
from redpack.credit_pace import LOOK_KEY, WAITING_KEY
from redpack.models import JournalEntry

from .test_ledger import grab_each, send

pytestmark = pytest.mark.django_db

FAST = 10_000  # grab rows "written" in the second before the look: far above the yield rate


def redis_now() -> float:
    return credit_pace._redis_now(get_redis_connection("default"))


def looked_a_second_ago(written: int) -> None:
    """The previous look, as if taken one second ago (by Redis's clock) with `written` grab
    rows fewer than now."""
    before = {alias: top - written for alias, top in credit_pace._highest_ids().items()}
    client = get_redis_connection("default")
    client.delete(LOOK_KEY)
    client.hset(LOOK_KEY, mapping={"at": redis_now() - 1, "ids": json.dumps(before)})


def waiting_since(seconds_ago: float) -> bytes:
    value = repr(redis_now() - seconds_ago).encode()
    get_redis_connection("default").set(WAITING_KEY, value)
    return value


def pending() -> int:
    return int(ledger.crediting_lag()["pending"])


def test_the_rate_is_the_grab_rows_written_since_the_last_look(sender, make_users):
    activity = send(sender, "10.00", 5)
    grab_each(activity, make_users(1, prefix="first", balance="0"))  # the ids' end, here
    looked_a_second_ago(0)
    grab_each(activity, make_users(3, prefix="then", balance="0"))
    rate = credit_pace.grab_rate(get_redis_connection("default"))
    assert rate is not None and 0 < rate <= 3  # three rows in a second and a little


def test_rows_gone_from_the_top_are_not_counted_again(sender, make_users):
    grab_each(send(sender, "10.00", 5), make_users(1, balance="0"))
    looked_a_second_ago(-100)  # the last look saw 100 ids more than there are now
    assert credit_pace.grab_rate(get_redis_connection("default")) == 0
    stored = json.loads(get_redis_connection("default").hget(LOOK_KEY, "ids"))
    assert stored == {a: top + 100 for a, top in credit_pace._highest_ids().items()}


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
    waiting_since(61)
    looked_a_second_ago(FAST)
    assert tasks.credit_grabs() == 3  # overdue: credited although grabs still come fast
    assert not get_redis_connection("default").exists(WAITING_KEY)  # caught up

    grab_each(activity, make_users(2, prefix="second", balance="0"))
    looked_a_second_ago(FAST)
    assert tasks.credit_grabs() == 0  # the next fast look waits anew
    assert pending() == 2


def test_an_overdue_run_cut_short_stays_overdue_until_one_catches_up(sender, make_users, settings):
    settings.REDPACK_CREDIT_MAX_WAIT = 60
    grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    since = waiting_since(61)
    looked_a_second_ago(FAST)
    settings.REDPACK_CREDIT_RUN_SECONDS = 0  # the run's time is up before its first batch
    assert tasks.credit_grabs() == 0
    assert get_redis_connection("default").get(WAITING_KEY) == since

    settings.REDPACK_CREDIT_RUN_SECONDS = 600
    looked_a_second_ago(FAST)
    assert tasks.credit_grabs() == 3
    assert not get_redis_connection("default").exists(WAITING_KEY)


def test_catching_up_keeps_a_newer_wait_another_worker_began(sender, make_users, settings):
    settings.REDPACK_CREDIT_MAX_WAIT = 60
    waiting_since(61)
    looked_a_second_ago(FAST)
    pace = credit_pace.Pace()
    assert pace.verdict == credit_pace.OVERDUE
    newer = waiting_since(0)  # meanwhile another worker caught up, and a new burst began
    pace.caught_up()
    assert get_redis_connection("default").get(WAITING_KEY) == newer


def test_a_run_begun_in_a_quiet_moment_stops_when_a_burst_begins(sender, make_users):
    grab_each(send(sender, "10.00", 5), make_users(5, balance="0"))
    looked_a_second_ago(0)
    clock = [0.0]
    pace = credit_pace.Pace(clock=lambda: clock[0])
    assert pace.verdict == credit_pace.QUIET
    asked = []

    def burst_begins() -> bool:
        asked.append(clock[0])
        if len(asked) == 2:  # after the first batch: a burst, and half a second on
            looked_a_second_ago(FAST)
            clock[0] += credit_pace.WINDOW
        return pace.burst_began()

    assert ledger.credit_run(batch=2, run_seconds=600, stop=burst_begins) == (2, False)
    assert asked == [0.0, 0.0]  # before the first batch (the look just taken), then again
    assert pending() == 3
    assert JournalEntry.objects.filter(kind="credit").count() == 2


def test_a_lull_does_not_end_the_wait_a_run_that_caught_up_does(sender, make_users, settings):
    settings.REDPACK_CREDIT_MAX_WAIT = 60
    grab_each(send(sender, "10.00", 5), make_users(5, balance="0"))
    since = waiting_since(30)  # a burst began 30 s ago; now a lull
    looked_a_second_ago(0)
    clock = [0.0]
    pace = credit_pace.Pace(clock=lambda: clock[0])
    assert pace.verdict == credit_pace.QUIET

    def burst_again() -> bool:  # half a second on, the burst goes on
        looked_a_second_ago(FAST)
        clock[0] += credit_pace.WINDOW
        return pace.burst_began()

    assert ledger.credit_run(batch=2, run_seconds=600, stop=burst_again) == (0, False)
    assert get_redis_connection("default").get(WAITING_KEY) == since  # the lull ended nothing

    looked_a_second_ago(0)
    assert tasks.credit_grabs() == 5  # a quiet run that catches up ends the wait
    assert not get_redis_connection("default").exists(WAITING_KEY)


def test_a_look_the_database_does_not_answer_holds_nothing_back(sender, make_users):
    grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    looked_a_second_ago(FAST)
    with mock.patch.object(credit_pace, "_highest_ids", side_effect=DatabaseError("gone")):
        assert credit_pace.Pace().verdict == credit_pace.QUIET
        assert tasks.credit_grabs() == 3


def test_times_from_redis_future_hold_nothing_back(sender, make_users):
    """Redis's clock stepped back: a look from its future gives no rate, a wait from its
    future has waited long enough."""
    client = get_redis_connection("default")
    client.hset(LOOK_KEY, mapping={"at": redis_now() + 100, "ids": json.dumps({})})
    assert credit_pace.grab_rate(client) is None
    waiting_since(-100)
    looked_a_second_ago(FAST)
    assert credit_pace.Pace().verdict == credit_pace.OVERDUE


def test_a_yield_rate_of_zero_never_waits(sender, make_users, settings):
    settings.REDPACK_CREDIT_YIELD_RATE = 0
    grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    looked_a_second_ago(FAST)
    assert tasks.credit_grabs() == 3


def test_without_redis_crediting_does_not_wait(sender, make_users, redis_proxy):
    grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    looked_a_second_ago(FAST)
    redis_proxy.cut()
    assert credit_pace.Pace().verdict == credit_pace.QUIET
    assert tasks.credit_grabs() == 3


def test_one_run_at_a_time_the_others_return_at_once(sender, make_users, settings):
    """While another run holds the lease, a run credits nothing and leaves that lease alone
    (the worker process is free for the persister and expiry); once it is gone, a run credits
    and gives its own lease back."""
    grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    looked_a_second_ago(0)
    client = get_redis_connection("default")
    client.set(credit_pace.RUN_KEY, "another run", px=60_000)
    assert tasks.credit_grabs() == 0
    assert pending() == 3
    assert client.get(credit_pace.RUN_KEY) == b"another run"
    client.delete(credit_pace.RUN_KEY)
    assert tasks.credit_grabs() == 3
    assert not client.exists(credit_pace.RUN_KEY)


def test_a_run_that_fails_gives_its_lease_back(sender, make_users):
    grab_each(send(sender, "10.00", 5), make_users(3, balance="0"))
    looked_a_second_ago(0)
    failing = mock.patch.object(ledger, "credit_run", side_effect=RuntimeError("boom"))
    with failing, pytest.raises(RuntimeError):
        tasks.credit_grabs()
    assert not get_redis_connection("default").exists(credit_pace.RUN_KEY)
    assert tasks.credit_grabs() == 3


def test_a_lease_outlived_by_its_run_is_not_taken_from_the_next(sender, make_users):
    """A run whose lease lapsed, and that another run took meanwhile, ends without ending the
    other's."""
    client = get_redis_connection("default")
    with credit_pace.one_run(1.0) as alone:
        assert alone
        client.set(credit_pace.RUN_KEY, "the next run")  # the lease lapsed and was taken
    assert client.get(credit_pace.RUN_KEY) == b"the next run"
