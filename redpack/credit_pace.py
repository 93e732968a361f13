"""When crediting runs: it yields to a burst of grabs, for a bounded time.

Crediting a grab (redpack/ledger.py) writes more rows than the grab did (its entry, two lines,
two balances, often a new wallet) on the same MySQL, and, under `make run`, on the same cores
as the web processes. Run beside a many-packets burst it took a fifth of the burst's grabs per
second (docs/benchmarks.md, "Crediting beside a burst"). So while grab rows are being written
faster than REDPACK_CREDIT_YIELD_RATE per second, the crediting task leaves them for later,
until REDPACK_CREDIT_MAX_WAIT seconds have passed since it began to wait; then it credits
whatever the rate, and once it has caught up it may wait again. A grab's amount reaches the
wallet within about one interval at a lower rate, within about REDPACK_CREDIT_MAX_WAIT
seconds (and the time to catch up) under a longer burst.

The rate is read off the grab rows themselves, not off the web processes (which may be many,
on other machines): the highest grab row id of each database (the primary key's end, one index
dive) against the one of the previous look, at least WINDOW seconds earlier. The look and the
time waiting began are in Redis, shared by every worker process.
"""

import contextlib
import json
import time
from typing import Any

from django.conf import settings
from django.db.models import Max
from django_redis import get_redis_connection
from redis.exceptions import RedisError

from . import shards
from .models import GrabDetail

LOOK_KEY = "rp:credit:look"  # hash: at (epoch seconds), ids (JSON: alias -> highest grab id)
WAITING_KEY = "rp:credit:waiting_since"  # epoch seconds the task began to wait
WINDOW = 0.5  # seconds: a look closer than this to the previous one reuses its rate


def _highest_ids() -> dict[str, int]:
    ids = {}
    for alias in shards.each():
        ids[alias] = GrabDetail.objects.using(alias).aggregate(top=Max("pk"))["top"] or 0
    return ids


def grab_rate(client: Any) -> float | None:
    """Grab rows written per second between the previous look and this one (None: no previous
    look). Looks less than WINDOW apart share the earlier one's rate."""
    now = time.time()
    last = client.hgetall(LOOK_KEY)
    if last and now - float(last[b"at"]) < WINDOW:
        rate = last.get(b"rate")
        return None if rate is None else float(rate)
    ids = _highest_ids()
    sample: dict[str, str | float] = {"at": now, "ids": json.dumps(ids)}
    rate_now = None
    if last:
        before = json.loads(last[b"ids"])
        written = sum(max(0, top - before.get(alias, top)) for alias, top in ids.items())
        rate_now = written / (now - float(last[b"at"]))
        sample["rate"] = rate_now
    pipe = client.pipeline(transaction=True)
    pipe.delete(LOOK_KEY)
    pipe.hset(LOOK_KEY, mapping=sample)
    pipe.execute()
    return rate_now


QUIET, WAIT, OVERDUE = "quiet", "wait", "overdue"


def verdict() -> str:
    """QUIET: grabs are written slower than REDPACK_CREDIT_YIELD_RATE per second (or the rate
    is 0: crediting never waits); WAIT: faster, and the task has waited less than
    REDPACK_CREDIT_MAX_WAIT seconds; OVERDUE: faster, and it has waited that long."""
    if settings.REDPACK_CREDIT_YIELD_RATE <= 0:
        return QUIET
    try:
        return _verdict(get_redis_connection("default"))
    except RedisError:  # no look without Redis: the money is not held back for it
        return QUIET


def _verdict(client: Any) -> str:
    rate = grab_rate(client)
    if rate is None or rate < settings.REDPACK_CREDIT_YIELD_RATE:
        client.delete(WAITING_KEY)
        return QUIET
    now = time.time()
    client.set(WAITING_KEY, now, nx=True)
    since = client.get(WAITING_KEY)
    waited = 0.0 if since is None else now - float(since)
    return WAIT if waited < settings.REDPACK_CREDIT_MAX_WAIT else OVERDUE


def burst_began() -> bool:
    """For a run that began in a quiet moment, between its transactions: stop, grabs are
    coming fast again."""
    return verdict() == WAIT


def waited_enough() -> None:
    """After a run that credited although grabs came fast: the next fast look waits anew."""
    # Without Redis, the next fast look finds it has waited long enough, and credits.
    with contextlib.suppress(RedisError):
        get_redis_connection("default").delete(WAITING_KEY)
