"""Activities sharded by id over several databases (docs/operations.md, "Scaling out").

The one place that maps an activity to its database. REDPACK_SHARDS lists the shard aliases in
order; activity `id` lives on `REDPACK_SHARDS[id % len(REDPACK_SHARDS)]`, with its packets, grab
rows, refund record and persist failures (`SHARDED_MODELS`). Users, sessions and the money
(wallets, escrows, the journal) stay on `default`, the ledger database. Empty (the default):
everything is on `default`, as if this module did not exist.

Code that runs for one activity runs inside `for_activity(activity_id)` (set at the entry
points: services, expiry, the persister, crediting, the auditor) and reaches the database
through `connection`, `atomic()` and `on_commit()` here, which take the current activity's
database; the ORM gets there through `ShardRouter`. A context variable holds the alias: each
thread (and each grab, each Celery task) has its own, so a combiner's leader, which runs the
batch of the activity it grabs, runs it on that activity's database.

Ids are unique over every shard: while sharded, `new_activity_id()` allocates them on
`default` (one auto-increment row in t_redpack_activity_id), before the activity exists.
"""

from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, models, transaction

from .hotsettings import hot

SHARDED_MODELS = frozenset({"activity", "packet", "grabdetail", "refund", "persistfailure"})

_current: ContextVar[str | None] = ContextVar("redpack_shard", default=None)


class NoShardChosen(RuntimeError):
    """An activity's table was queried while sharded, outside `for_activity()` / `each()`."""


def enabled() -> bool:
    return bool(settings.REDPACK_SHARDS)


def alias_of(activity_id: int) -> str:
    """The database of the activity (`default` when not sharded)."""
    aliases = hot.REDPACK_SHARDS
    return aliases[activity_id % len(aliases)] if aliases else DEFAULT_DB_ALIAS


def current() -> str:
    """The database of the activity being worked on (`default` outside any)."""
    return _current.get() or DEFAULT_DB_ALIAS


class using:  # noqa: N801 - used as a function, like transaction.atomic
    """This database is the current one until the block ends (a class, not a generator: it is
    on every grab's path)."""

    __slots__ = ("alias", "token")

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def __enter__(self) -> str:
        self.token = _current.set(self.alias)
        return self.alias

    def __exit__(self, *exc_info: object) -> None:
        _current.reset(self.token)


def for_activity(activity_id: int) -> using:
    """Work on this activity: its database is the current one until the block ends."""
    return using(alias_of(activity_id))


def each() -> Iterator[str]:
    """Every database that holds activities, each the current one in turn (scans and audits)."""
    for alias in settings.REDPACK_SHARDS or (DEFAULT_DB_ALIAS,):
        with using(alias):
            yield alias


def atomic(**kwargs: Any) -> transaction.Atomic:
    """`transaction.atomic()` on the current activity's database."""
    return transaction.atomic(using=current(), **kwargs)


def on_commit(func: Callable[[], object], *, robust: bool = False) -> None:
    """`transaction.on_commit()` on the current activity's database."""
    transaction.on_commit(func, using=current(), robust=robust)


class CurrentConnection:
    """`django.db.connection` for the current activity's database (raw SQL, `vendor`)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(connections[current()], name)


connection: Any = CurrentConnection()


def new_activity_id() -> int | None:
    """A fresh activity id from `default` while sharded (unique over every shard); None when
    not sharded (the activity table's own auto-increment)."""
    if not enabled():
        return None
    from .models import ActivityId

    return ActivityId.objects.using(DEFAULT_DB_ALIAS).create().pk


def ledger_is_apart() -> bool:
    """The money and the activities are in different databases: a transaction on one does not
    cover the other."""
    return current() != DEFAULT_DB_ALIAS


class ShardRouter:
    """DATABASE_ROUTERS while sharded: an activity's tables on its shard, the rest on default.
    Every database gets the whole schema (migrate runs on each; redpack/migrations/0005 drops the
    foreign keys that would point across databases), only the right rows are written."""

    def _db(self, model: type[models.Model], hints: dict[str, Any]) -> str:
        if model._meta.app_label != "redpack" or model._meta.model_name not in SHARDED_MODELS:
            return DEFAULT_DB_ALIAS
        alias = _current.get()
        if alias is not None:
            return alias
        instance = hints.get("instance")
        if instance is not None and instance._state.db in settings.REDPACK_SHARDS:
            return str(instance._state.db)
        raise NoShardChosen(
            f"{model._meta.label} queried outside shards.for_activity() while sharded"
        )

    def db_for_read(self, model: type[models.Model], **hints: Any) -> str:
        return self._db(model, hints)

    def db_for_write(self, model: type[models.Model], **hints: Any) -> str:
        return self._db(model, hints)

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True  # grab rows name users and escrows name activities across databases, by id
