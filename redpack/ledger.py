"""The money: a double-entry ledger of a wallet per user, one platform funding account and an
escrow account per activity (docs/design.md, "Money").

- Every movement is one journal entry whose lines sum to 0; the accounts' balances change in
  the same transaction as the lines are written, so a balance is always the sum of its lines.
- Send (`send_debit` + `escrow_open`, in the send's transaction): the total leaves the sender's
  wallet by one conditional UPDATE (`balance >= total`), so concurrent sends never overdraw.
- Refund (`refund_post`, in the refund's transaction, the activity row locked): what was left
  goes from the escrow back to the sender, tied to the refund record by a UNIQUE key.
- Grabs (`grabs_credit`, a Celery task, never on the grab path): each grab row is credited from
  the escrow to the grabber's wallet by one entry, tied to the row by a UNIQUE key. The work to
  do is found through the escrows: an activity has uncredited grabs exactly when its escrow
  holds more than its surplus (the escrow index keeps the scan to activities with money left).
- Lock order: accounts are locked in ascending id order, after the activity row where one is
  locked (the refund); crediting never locks an activity row. No cycle, no deadlock.
- Sharded (redpack/shards.py), the ledger stays on default and the activities do not: the send
  commits its debit before the activity, the refund its record before its entry, and crediting
  reads the grab rows on their shard, then posts on default; the UNIQUE keys keep each once.
"""

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Count, F, Min, Model, QuerySet
from django.utils import timezone

from . import dberrors, shards
from .errors import InsufficientBalance, InvalidInput
from .models import (
    Account,
    AccountKind,
    Activity,
    EntryKind,
    GrabDetail,
    JournalEntry,
    JournalLine,
    Refund,
)
from .money import from_cents, minus, sql_decimal, to_cents

logger = logging.getLogger(__name__)

CHUNK = 5000  # wallets per top-up transaction


def funding_account() -> Account:
    """The platform's account; created by migrate (and after a flush), else here."""
    account, _ = Account.objects.get_or_create(kind=AccountKind.FUNDING)
    return account


WALLET_INSERT_TRIES = 3


def wallets_ensure(user_ids: Iterable[int]) -> dict[int, int]:
    """Wallet account ids by user id, creating the missing wallets (at 0)."""
    wanted = set(user_ids)
    found = dict(
        Account.objects.filter(kind=AccountKind.WALLET, user_id__in=wanted).values_list(
            "user_id", "pk"
        )
    )
    missing = wanted - found.keys()
    if missing:
        for attempt in range(1, WALLET_INSERT_TRIES + 1):
            try:
                Account.objects.bulk_create(
                    [Account(kind=AccountKind.WALLET, user_id=u) for u in missing],
                    ignore_conflicts=True,
                )
                break
            except OperationalError as exc:
                # Two runs creating the same users' wallets at once can deadlock on the unique
                # key (InnoDB's locks on a duplicate). The insert ignores what exists, so on its
                # own (not inside a caller's transaction, which the deadlock rolled back) it is
                # simply made again.
                deadlock = dberrors.code(exc) == dberrors.DEADLOCK
                if not deadlock or connection.in_atomic_block or attempt == WALLET_INSERT_TRIES:
                    raise
        found.update(
            Account.objects.filter(kind=AccountKind.WALLET, user_id__in=missing).values_list(
                "user_id", "pk"
            )
        )
    return found


def _lock(account_ids: Iterable[int]) -> dict[int, Decimal]:
    """Lock the accounts in ascending id order (the ledger's one lock order); their balances by
    id (no model object each: a crediting run locks hundreds of wallets)."""
    ids = sorted(set(account_ids))
    locked = Account.objects.select_for_update().filter(pk__in=ids).order_by("pk")
    return dict(locked.values_list("pk", "balance"))


def _apply(deltas: dict[int, int]) -> None:
    """Add each account's delta (cents) to its balance, in one statement. Written out rather than
    as the ORM's Case(When(...)): a crediting run moves hundreds of wallets at once, and
    compiling that many expressions cost more than the statement itself."""
    deltas = {account: cents for account, cents in deltas.items() if cents}
    if not deltas:
        return
    quote = connection.ops.quote_name
    pk = quote(Account._meta.pk.column or "id")
    balance = quote(Account._meta.get_field("balance").column or "balance")  # type: ignore[union-attr]
    cases = " ".join(f"WHEN {int(account)} THEN {sql_decimal(c)}" for account, c in deltas.items())
    sql = (
        f"UPDATE {quote(Account._meta.db_table)}"
        f" SET {balance} = ROUND({balance} + CASE {pk} {cases} END, 2)"
        f" WHERE {pk} IN ({', '.join(str(int(account)) for account in deltas)})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)


class Cents(int):
    """An amount in cents, written into `_insert`'s statement as a DECIMAL literal."""


Row = tuple[int | str | None, ...]
INSERT_ROWS = 1000  # rows per INSERT statement: a large REDPACK_CREDIT_BATCH goes out in parts


def _insert(model: type[Model], fields: Sequence[str], rows: list[Row]) -> None:
    """Rows of `model` (the values of `fields`, in that order) in multi-row INSERTs of up to
    INSERT_ROWS rows, without a model object each: the journal rows of a crediting run.
    Integers, `Cents` (money.sql_decimal) and None go into the statement as they are, built from
    the value alone; only strings are parameters, escaped by the driver (a crediting run's
    hundreds of rows spent more time escaping numbers than MySQL spent inserting them). No field
    default or conversion of Django's applies: a column not named must be nullable or have a
    default in the database."""
    quote = connection.ops.quote_name
    column = {f.name: f.column for f in model._meta.concrete_fields if f.column is not None}
    columns = ", ".join(quote(column[name]) for name in fields)
    params: list[str] = []

    def literal(value: int | str | None) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, str):
            params.append(value)
            return "%s"
        if isinstance(value, Cents):
            return sql_decimal(int(value))
        if type(value) is not int:
            raise TypeError(f"not a journal value: {value!r}")
        return str(value)

    with connection.cursor() as cursor:
        for start in range(0, len(rows), INSERT_ROWS):
            params.clear()
            part = rows[start : start + INSERT_ROWS]
            values = ", ".join(f"({', '.join(literal(value) for value in row)})" for row in part)
            cursor.execute(
                f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES {values}", params
            )


def _balanced(lines: dict[int, int]) -> list[tuple[int, int]]:
    """An entry's lines (account -> cents) as written: they sum to 0, and none is 0."""
    if sum(lines.values()) != 0:
        raise ValueError(f"unbalanced entry: {lines}")
    return [(account, cents) for account, cents in lines.items() if cents]


def _lines(entry: JournalEntry, lines: dict[int, int]) -> list[JournalLine]:
    return [
        JournalLine(entry=entry, account_id=account, amount=from_cents(cents))
        for account, cents in _balanced(lines)
    ]


def _post(entry: JournalEntry, lines: dict[int, int], *, apply: bool = True) -> JournalEntry:
    """Write one entry and its lines; `apply`: also move the balances (the caller holds the
    accounts' locks, or has moved them itself)."""
    entry.save()
    JournalLine.objects.bulk_create(_lines(entry, lines))
    if apply:
        _apply(lines)
    return entry


def deposit_cents(amount: Decimal | str) -> int:
    """A deposit's amount checked: whole cents, at least 0.01, at most REDPACK_MAX_DEPOSIT."""
    try:
        cents = to_cents(amount)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="amount") from exc
    if not 1 <= cents <= to_cents(settings.REDPACK_MAX_DEPOSIT):
        raise InvalidInput(
            f"amount must be between 0.01 and {settings.REDPACK_MAX_DEPOSIT}", field="amount"
        )
    return cents


def wallet_deposit(
    *, user_id: int, amount: Decimal | str, by_id: int | None = None, memo: str = ""
) -> JournalEntry:
    """Move `amount` from the funding account into the user's wallet."""
    cents = deposit_cents(amount)
    wallet_id = wallets_ensure([user_id])[user_id]
    with transaction.atomic():
        funding = funding_account()
        _lock([funding.pk, wallet_id])
        entry = JournalEntry(kind=EntryKind.DEPOSIT, created_by_id=by_id, memo=memo[:200])
        return _post(entry, {funding.pk: -cents, wallet_id: cents})


def wallets_top_up(*, user_ids: Sequence[int], to: Decimal | str | None = None, memo: str) -> int:
    """Deposit into each wallet below `to` (default REDPACK_STARTING_BALANCE) what it lacks:
    one entry per chunk of wallets. Returns how many wallets were topped up."""
    floor = to_cents(settings.REDPACK_STARTING_BALANCE if to is None else to)
    topped = 0
    for start in range(0, len(user_ids), CHUNK) if floor > 0 else ():
        wallets = wallets_ensure(user_ids[start : start + CHUNK])
        low = Account.objects.filter(pk__in=wallets.values(), balance__lt=from_cents(floor))
        low_ids = list(low.values_list("pk", flat=True))
        if not low_ids:
            continue
        with transaction.atomic():
            funding = funding_account()
            locked = _lock([funding.pk, *low_ids])
            lines = {
                pk: floor - to_cents(balance)
                for pk, balance in locked.items()
                if pk != funding.pk and to_cents(balance) < floor
            }
            if lines:
                lines[funding.pk] = -sum(lines.values())
                _post(JournalEntry(kind=EntryKind.DEPOSIT, memo=memo[:200]), lines)
                topped += len(lines) - 1
    return topped


def send_debit(*, sender_id: int, total_cents: int) -> int:
    """Take the total from the sender's wallet (inside the send's transaction): one conditional
    UPDATE, which waits for and then sees any concurrent send's debit. Returns the wallet's id;
    raises InsufficientBalance (nothing changed) when the balance does not cover the total."""
    wallet_id = (
        Account.objects.filter(kind=AccountKind.WALLET, user_id=sender_id)
        .values_list("pk", flat=True)
        .first()
    )
    if wallet_id is None or not Account.objects.filter(
        pk=wallet_id, balance__gte=from_cents(total_cents)
    ).update(balance=minus("balance", total_cents)):
        raise InsufficientBalance(
            f"your wallet does not hold {from_cents(total_cents)}", field="total_amount"
        )
    return wallet_id


def escrow_open(*, activity_id: int, wallet_id: int, total_cents: int) -> None:
    """The activity's escrow, holding the total that `send_debit` took (same transaction)."""
    escrow = Account.objects.create(
        kind=AccountKind.ESCROW, activity_id=activity_id, balance=from_cents(total_cents)
    )
    entry = JournalEntry(kind=EntryKind.SEND, activity_id=activity_id)
    _post(entry, {wallet_id: -total_cents, escrow.pk: total_cents}, apply=False)


def refund_post(*, refund: Refund, sender_id: int) -> None:
    """What the refund record gives back, from the escrow to the sender's wallet, once (its
    entry is UNIQUE per record, and looked for under the escrow's lock). Inside the refund's
    transaction when the ledger shares its database; while sharded, after the record committed
    on its shard (a crash in between is healed by `grabs_credit`, which posts it)."""
    cents = to_cents(refund.amount)
    escrow_id = (
        Account.objects.filter(activity_id=refund.activity_id).values_list("pk", flat=True).first()
    )
    if escrow_id is None or cents == 0:
        return  # an activity without money (the lab's ceilings) or nothing left
    wallet_id = wallets_ensure([sender_id])[sender_id]
    with transaction.atomic(savepoint=False):
        _lock([escrow_id, wallet_id])
        if JournalEntry.objects.filter(refund_id=refund.pk).exists():
            return
        entry = JournalEntry(
            kind=EntryKind.REFUND, activity_id=refund.activity_id, refund_id=refund.pk
        )
        _post(entry, {escrow_id: -cents, wallet_id: cents})


def _owed_escrows() -> QuerySet[Account]:
    """Escrows of activities with uncredited grabs, in one database: holding more than their
    surplus (the part of the escrow that still belongs to future grabs or the refund)."""
    return Account.objects.filter(kind=AccountKind.ESCROW, balance__gt=0).filter(
        balance__gt=F("activity__surplus_amount")
    )


def activities_to_credit() -> list[int]:
    """Activities with uncredited grabs (`_owed_escrows`). Sharded, each shard is asked for the
    surplus of the activities whose escrow holds money."""
    if not shards.enabled():
        return list(_owed_escrows().values_list("activity_id", flat=True))
    held = dict(
        Account.objects.filter(kind=AccountKind.ESCROW, balance__gt=0).values_list(
            "activity_id", "balance"
        )
    )
    found = []
    for _ in shards.each():
        surplus = Activity.objects.filter(pk__in=held).values_list("pk", "surplus_amount")
        found += [pk for pk, amount in surplus if held[pk] > amount]
    return sorted(found)


def uncredited(
    activity_id: int, *, after: int = 0, limit: int
) -> tuple[list[tuple[int, int, Decimal]], int | None]:
    """Up to `limit` of the activity's grab rows after id `after` that no credit entry names,
    as (id, user, amount), and the id to go on after (None: no row is left to look at). Call it
    for the activity (shards.for_activity): while sharded, the rows are on its shard and the
    entries on default, read one after the other."""
    rows = GrabDetail.objects.filter(activity_id=activity_id, pk__gt=after).order_by("pk")
    if not shards.ledger_is_apart():
        found = list(
            rows.filter(credit__isnull=True).values_list("pk", "user_id", "amount")[:limit]
        )
        return found, found[-1][0] if len(found) == limit else None
    scanned = list(rows.values_list("pk", "user_id", "amount")[:limit])
    credited = set(
        JournalEntry.objects.filter(grab_id__in=[pk for pk, _, _ in scanned]).values_list(
            "grab_id", flat=True
        )
    )
    found = [row for row in scanned if row[0] not in credited]
    return found, scanned[-1][0] if len(scanned) == limit else None


def grabs_credit(*, batch: int, run_seconds: float) -> int:
    """Credit uncredited grab rows, at most `batch` per transaction, until none is left or
    `run_seconds` passed. Safe to run twice, or in two workers at once. Returns how many.
    While sharded, it also posts a refund entry a crash left unposted (credit_run)."""
    return credit_run(batch=batch, run_seconds=run_seconds)[0]


def credit_run(
    *, batch: int, run_seconds: float, stop: Callable[[], bool] | None = None
) -> tuple[int, bool]:
    """grabs_credit, which also stops when `stop()`, asked before each batch of rows is read,
    says so. Returns how many it credited, and whether it went through every grab to credit
    (not stopped). While sharded, it posts a refund entry a crash left unposted
    (refunds_post), for every activity of every run, stopped or not."""
    until = time.monotonic() + run_seconds
    credited = 0
    finished = True
    for activity_id in activities_to_credit():
        with shards.for_activity(activity_id):
            if shards.ledger_is_apart():
                refunds_post(activity_id)
            after: int | None = 0
            while finished and after is not None:
                if time.monotonic() >= until or (stop is not None and stop()):
                    finished = False
                    break
                rows, after = uncredited(activity_id, after=after, limit=batch)
                if rows:
                    done, short = _credit(activity_id, rows)
                    credited += done
                    if short:
                        break
        if not finished and not shards.enabled():  # else on, for refunds_post
            break
    return credited, finished


def refunds_post(activity_id: int) -> None:
    """The activity's refund entry, if its refund record exists and the entry does not yet
    (call it for the activity, shards.for_activity)."""
    refund = Refund.objects.filter(activity_id=activity_id).first()
    if refund is not None and not JournalEntry.objects.filter(refund_id=refund.pk).exists():
        sender_id = Activity.objects.filter(pk=activity_id).values_list("sender_id", flat=True)[0]
        refund_post(refund=refund, sender_id=sender_id)


def _credit(activity_id: int, rows: list[tuple[int, int, Decimal]]) -> tuple[int, bool]:
    """One transaction: the rows (of one activity) not credited yet, each by its own entry.
    Returns how many it credited, and whether the escrow fell short of the next one."""
    wallets = wallets_ensure(user_id for _, user_id, _ in rows)
    with transaction.atomic():
        escrow_id = Account.objects.filter(activity_id=activity_id).values_list("pk", flat=True)[0]
        locked = _lock([escrow_id, *wallets.values()])
        # Under the escrow's lock, which every crediting of this activity takes: a row another
        # run credited in the meantime is seen here and left alone.
        ids = [r[0] for r in rows]
        pending = set(ids) - set(
            JournalEntry.objects.filter(grab_id__in=ids).values_list("grab_id", flat=True)
        )
        activity = Activity.objects.filter(pk=activity_id)
        surplus = activity.values_list("surplus_amount", flat=True)[0]
        room = to_cents(locked[escrow_id]) - to_cents(surplus)
        credits: list[tuple[int, int, int]] = []  # (grab, wallet, cents)
        short = False
        for pk, user_id, amount in rows:
            cents = to_cents(amount)
            if pk not in pending:
                continue
            if cents > room:
                # Only an overselling strategy gets here: its rows hold more than it was sent.
                logger.warning(
                    "grab not creditable",
                    extra={"event": "credit_short", "activity": activity_id, "grab": pk},
                )
                short = True
                break
            room -= cents
            credits.append((pk, wallets[user_id], cents))
        if credits:
            _post_credits(activity_id, escrow_id, credits)
    return len(credits), short


def _post_credits(activity_id: int, escrow_id: int, credits: list[tuple[int, int, int]]) -> None:
    """One credit entry per (grab, wallet, cents), its two lines (escrow -cents, wallet
    +cents), and the balances moved: three multi-row statements and one read of the entries'
    ids, however many grabs."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    _insert(
        JournalEntry,
        ("kind", "activity", "grab", "memo", "created_at"),
        [(EntryKind.CREDIT.value, activity_id, grab, "", now) for grab, _, _ in credits],
    )
    entry_of = dict(
        JournalEntry.objects.filter(grab_id__in=[grab for grab, _, _ in credits]).values_list(
            "grab_id", "pk"
        )
    )
    lines: list[Row] = []
    deltas: dict[int, int] = {}
    for grab, wallet_id, cents in credits:
        for account, moved in _balanced({escrow_id: -cents, wallet_id: cents}):
            lines.append((entry_of[grab], account, Cents(moved)))
            deltas[account] = deltas.get(account, 0) + moved
    _insert(JournalLine, ("entry", "account", "amount"), lines)
    _apply(deltas)


def crediting_lag() -> dict[str, int | float]:
    """Grabs not credited yet: how many, and the oldest one's age in seconds (0 when none)."""
    if not shards.enabled():
        activities = _owed_escrows().values("activity_id")
        lag = GrabDetail.objects.filter(activity_id__in=activities, credit__isnull=True).aggregate(
            pending=Count("pk"), oldest=Min("created_at")
        )
        pending, oldest = lag["pending"], lag["oldest"]
    else:
        pending, oldest = 0, None
        for activity_id in activities_to_credit():
            with shards.for_activity(activity_id):
                ids: list[int] = []
                after: int | None = 0
                while after is not None:
                    rows, after = uncredited(activity_id, after=after, limit=CHUNK)
                    ids += [pk for pk, _, _ in rows]
                if ids:
                    pending += len(ids)
                    first = GrabDetail.objects.filter(pk=ids[0]).values_list("created_at")[0][0]
                    oldest = first if oldest is None else min(oldest, first)
    age = 0.0 if oldest is None else max(0.0, (timezone.now() - oldest).total_seconds())
    return {"pending": pending, "oldest_age_seconds": round(age, 3)}
