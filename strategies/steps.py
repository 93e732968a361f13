"""The grab steps every strategy shares, each written once: refuse, look up, record, close.

- `refusal`: the contract's order of answers for a loaded activity row (closed, then
  already_grabbed, then sold_out).
- `held_cents` / `held_marks`: what a user already grabbed (the dedupe lookup).
- `after_duplicate`: the answer once UNIQUE (activity, user) or the user's foreign key refused a
  grab row: the first grab's amount, or 403 for a user that does not exist.
- `take_from_surplus` + `insert_grab_rows` (`record_grab` for one): the surplus decrement and the
  grab rows, in the lock order below.
- `claim_packet` (`claim_packets` for a batch), `split_into_packets`: the pre-split packets
  (t_redpack).
- `close_row_locked`: stop grabs under the activity's row lock and report what is left.
- `written_row`: after a write whose outcome is unknown (COMMIT in doubt), what MySQL holds;
  `batch_written`: whether that write was the batch's own (its rows, stamped with its INSERT's
  clock).
- `grab_transaction`: the transaction of a grab (or a batch of grabs) on the hot path; its
  `commit_with_grabs` makes a batch's writes and commits: the packets' claim and the decrement
  in one query, the INSERT and the COMMIT in another.

Every statement goes to the current activity's database (redpack/shards.py: `connection` and
`atomic()` there), so a strategy runs unchanged on a shard.

Lock order. InnoDB checks a foreign key by taking a shared lock on the parent row, and the
details' foreign key to the activity sits on their index (activity_id, user_id): inserting a
detail takes a shared lock on the activity row. Two grabs that each hold it shared and then both
want to update the row deadlock. So every writer takes the activity row exclusively (its
decrement, or SELECT … FOR UPDATE) before it inserts a detail. Claiming a pre-split packet
changes its status, not its foreign key's index (activity_id) of its own (migration 0006), so a
claim takes no lock on the activity row: a batch claims its packets first, and holds the
activity's row only for the decrement, the insert and the commit (`record_grabs`). On the
request path the claim and the decrement go to MySQL as one query, the insert and the commit as
another (`GrabTransaction.commit_with_grabs`): the row is held for one round trip.
"""

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
)
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from redpack import allocation, dberrors, shards
from redpack.errors import Forbidden, OutcomeUnknown
from redpack.models import Activity, ActivityStatus, GrabDetail, Packet, PacketStatus
from redpack.money import from_cents, minus, sql_decimal, to_cents
from redpack.shards import connection

from . import holds, turns
from .base import CloseResult, GrabResult, Outcome

# A raw MySQL statement and its parameters, as the hot path runs it (`*_sql` below); the lab's
# raw ceilings run the same ones from plain mysqlclient connections (redpack/lab/ceilings.py).
Statement = tuple[str, list[Any]]
Result = TypeVar("Result")

logger = logging.getLogger(__name__)
# The grab_transaction open on MySQL in this context (insert_grab_rows tells it its rows).
_open_transaction: ContextVar["GrabTransaction | None"] = ContextVar(
    "grab_transaction", default=None
)


@contextmanager
def grab_transaction(
    turn: int | None = None, *, ask_known: bool = False
) -> Iterator["GrabTransaction"]:
    """One transaction for a grab's statements: on MySQL, START TRANSACTION … COMMIT on the
    connection as it is (autocommit), two round trips fewer than Django's atomic(), which turns
    autocommit off and on again around every transaction, and START TRANSACTION sent with the
    transaction's first statement, in its query (`GrabTransaction.begin_with`), one more round
    trip fewer; anywhere else, or inside an outer transaction, shards.atomic(). It yields a
    `GrabTransaction`, whose `commit_with_grabs` sends the writes made once the activity's row
    is held in one query with the COMMIT.

    `turn`: an activity id; the transaction waits for that activity's turn in this process
    first (turns.py), for a one-grab transaction that takes the activity's row lock. Not inside
    an outer transaction: that one may hold the row already, and a turn it let go of would let
    another grab in to wait on that row while its own waits on the turn. `ask_known`: the grab
    has written nothing and holds no lock before it (see turns.turn).

    Inside, use only statements that open no transaction of their own (the raw ones of this
    module, ORM reads and QuerySet.update), through the activity's connection (every Django
    cursor of it: the first one's statement carries START TRANSACTION). A failed COMMIT
    propagates: its outcome is unknown (see `written_row`). ROLLBACK on any other error; a
    connection that cannot even roll back is closed, which ends the transaction too. A block
    that sent no statement sends nothing at its end either. A statement after the connection
    closed under the transaction is refused (`check_connection`), never sent on a new
    connection, where it would commit on its own.
    """
    if turn is not None and not connection.in_atomic_block:
        with turns.turn(turn, ask_known=ask_known), grab_transaction() as transaction:
            yield transaction
        return
    if connection.vendor != "mysql" or connection.in_atomic_block:
        with shards.atomic():
            yield GrabTransaction(None)
        return
    wrapper = connections[shards.current()]
    transaction = GrabTransaction(wrapper)
    # Connected before the wrapper is on: a new connection's own set-up statements (the
    # session's isolation level among them) run before the transaction, not in it.
    wrapper.ensure_connection()
    holds.began()
    current = _open_transaction.set(transaction)
    try:
        with wrapper.execute_wrapper(transaction.begin_with):
            yield transaction
    except BaseException:
        transaction.roll_back()
        raise
    else:
        if transaction.refused:
            transaction.roll_back()
        elif transaction.begun and not transaction.committed:
            transaction.check_connection()
            transaction.commit()
    finally:
        _open_transaction.reset(current)
        holds.released()


@dataclass(frozen=True)
class GrabRow:
    """One row of t_redpack_detail about to be written."""

    user_id: int
    cents: int
    packet_id: int | None = None


def claims_of(rows: list[GrabRow]) -> list[GrabRow]:
    """The rows that claim a pre-split packet (t_redpack) as they are written."""
    return [row for row in rows if row.packet_id is not None]


class GrabTransaction:
    """What `grab_transaction` yields: the transaction, and its end with a batch's writes."""

    def __init__(self, wrapper: Any | None) -> None:
        # The activity's connection, whose transaction this is; None inside shards.atomic().
        self.wrapper: Any = wrapper
        # Reused from an earlier use: it may have died since (no ping on the way, `begin_with`).
        self.reused = wrapper is not None and wrapper.connection is not None
        if wrapper is not None:
            # Django pings MySQL before the first statement of each request (CONN_HEALTH_CHECKS);
            # a grab's transaction goes without: one round trip fewer, often its request's only
            # use of MySQL. A connection that died meanwhile fails the first statement, which
            # `begin_with` then sends again on a new one, as the ping would have had it.
            wrapper.health_check_done = True
        self.began_on: Any = None  # the DB-API connection its START TRANSACTION went on
        self.reconnecting = False
        self.committed = False
        # A claim fell short (commit_with_grabs returned False): the transaction ends in
        # ROLLBACK, never COMMIT, whatever the caller sends after.
        self.refused = False
        # The grab rows sent in it (commit_with_grabs, insert_grab_rows; on MySQL), each batch
        # with its created_at, what tells them from any other transaction's (`written`); and
        # whether any statement but a SELECT went (`commit`).
        self.inserted: list[tuple[int, list[GrabRow], datetime]] = []
        self.wrote = False

    def begin_with(
        self,
        execute: Callable[..., Any],
        sql: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        """Django's execute wrapper on the activity's connection while the transaction lasts:
        its first statement goes to MySQL in one query after START TRANSACTION, and the cursor
        is moved on to that statement's result (its rows, its rowcount, its error).

        That query commits nothing, so if the connection turns out to have died since its last
        use (reused: MySQL may have closed it, or been restarted), whatever of it MySQL ran was
        rolled back with the connection: it is sent once more on a new connection."""
        if self.reconnecting:  # the new connection's own set-up, before the transaction
            return execute(sql, params, many, context)
        # Only statements that write nothing start with SELECT here (the lookups, the row
        # lock); anything else counts as a write, which only makes `commit` more careful.
        if sql.lstrip()[:6].upper() != "SELECT":
            self.wrote = True
        if self.begun:
            self.check_connection()
            return execute(sql, params, many, context)
        self.began_on = self.wrapper.connection  # open: connected on entry
        cursor = context["cursor"]
        if many:  # a batch of parameter sets: START TRANSACTION goes first, on its own
            cursor.execute("START TRANSACTION")
            return execute(sql, params, many, context)
        sent = time.monotonic()
        try:
            result = execute(started_with(sql), params, many, context)
        except OperationalError as exc:
            if not self.reused or dberrors.code(exc) not in dberrors.CONNECTION_LOST:
                raise
            if self.waited_out(sent):
                raise  # a MySQL that stopped answering: sent again, it would wait as long again
            self.reused = False
            self.reconnecting = True
            try:
                self.wrapper.close()
                self.wrapper.ensure_connection()
            finally:
                self.reconnecting = False
            self.began_on = self.wrapper.connection
            cursor.cursor = self.wrapper.create_cursor()
            result = execute(started_with(sql), params, many, context)
        next_result(cursor)
        return result

    def waited_out(self, sent: float) -> bool:
        """Whether a statement sent at `sent` failed only once the connection's reply wait
        (DB_READ_TIMEOUT) had run out (half of it, at least), where a connection MySQL closed
        while idle fails at once."""
        wait = self.wrapper.settings_dict["OPTIONS"].get("read_timeout")
        return bool(wait) and time.monotonic() - sent >= wait / 2

    @property
    def begun(self) -> bool:
        """START TRANSACTION went out (with the transaction's first statement)."""
        return self.began_on is not None

    def open(self) -> bool:
        """Begun, on the connection still open: a transaction MySQL holds for it."""
        return self.begun and self.wrapper.connection is self.began_on

    def roll_back(self) -> None:
        """ROLLBACK, if MySQL holds the transaction; a connection that cannot even roll back is
        closed, which ends the transaction too."""
        if not self.open():
            return
        try:
            with self.wrapper.cursor() as cursor:
                cursor.execute("ROLLBACK")
        except DatabaseError:
            self.wrapper.close()

    def commit(self) -> None:
        """COMMIT, on its own. When its reply is lost (the connection dropped: committed or
        not), what the transaction wrote says which: a transaction that wrote nothing changed
        nothing either way, and its answers stand; one whose grab rows MySQL holds, stamped
        with its INSERT's created_at (`batch_written`), committed, as if the reply had come.
        Otherwise the error propagates (proven not written; or wrote something else), or
        OutcomeUnknown when MySQL cannot be asked."""
        try:
            with self.wrapper.cursor() as cursor:
                cursor.execute("COMMIT")
        except (DatabaseError, InterfaceError) as exc:
            if not dberrors.connection_failed(exc):
                raise
            if not self.wrote:
                self.wrapper.close()
                return
            if not self.written():
                raise
            logger.warning("a grab's COMMIT lost its reply; MySQL holds its rows: committed")

    def written(self) -> bool:
        """After a failure whose outcome is unknown: whether MySQL holds the grab rows this
        transaction sent, as it sent them (`batch_written`); False when it sent none.
        OutcomeUnknown when MySQL cannot be asked."""
        return bool(self.inserted) and all(
            batch_written(activity_id=activity_id, rows=rows, at=at)
            for activity_id, rows, at in self.inserted
        )

    def check_connection(self) -> None:
        """A statement after the first goes only on the connection the transaction began on:
        on another (the first closed meanwhile, and MySQL rolled back what it held) it would
        run on its own, committed at once."""
        if not self.open():
            raise OperationalError(
                dberrors.SERVER_GONE,
                "the grab transaction's connection was closed: nothing of it was committed",
            )

    def commit_with_grabs(
        self, *, activity_id: int, rows: list[GrabRow], row_locked: bool = False
    ) -> bool:
        """Claim the rows' pre-split packets, take the rows' packets and cents from the surplus,
        insert the rows, and commit. False when a packet was not available: nothing was
        decremented, and the transaction can only roll back (at grab_transaction's end, or at
        once if the caller raises); the caller answers for the rows.

        On MySQL, in the transaction's own START TRANSACTION, the statements go in as few
        queries as the outcome allows, each a round trip fewer: the claim and the decrement as
        one (`claim_then_take_sql`, in the lock order above), then the INSERT and the COMMIT as
        one (`commit_with_grabs_sql`). Inside shards.atomic(), claim_packets, take_from_surplus
        and insert_grab_rows; the block commits.

        The COMMIT's query is sent only while this transaction holds the activity's row. If the
        connection drops before MySQL has even read it (a network path that gave up on the
        client's side), MySQL may still run it, COMMIT and all; `written_row`, which asks
        behind the row's lock, then waits for it, and its answer stays final. So `row_locked`
        (the caller's lookup locked the row: group_commit, which has no packets to claim)
        sends the decrement in the COMMIT's query; otherwise the decrement goes in the query
        before, and takes the row.

        A statement that fails stops the ones after it: nothing is committed, and
        grab_transaction rolls back. The connection dropped before the last reply: the outcome
        is unknown, as for any COMMIT (`written_row`).
        """
        if self.committed or self.refused or not rows:
            raise RuntimeError("a grab transaction commits once, with at least one row")
        claims = claims_of(rows)
        if self.wrapper is None:
            if claims and not claim_packets(activity_id=activity_id, rows=claims):
                connection.set_rollback(True)  # the atomic block ends in a rollback
                self.refused = True
                return False
            take_and_insert(activity_id=activity_id, rows=rows)
            return True
        if row_locked and (claims or not self.begun):
            raise RuntimeError("row_locked: a statement of this transaction locked the row")
        with self.wrapper.cursor() as cursor:
            if not row_locked:
                cursor.execute(*claim_then_take_sql(activity_id=activity_id, rows=rows))
                if not claimed_all(cursor, rows):  # the row was not taken
                    self.refused = True
                    return False
                holds.taken()
            stamp = timezone.now()
            self.inserted.append((activity_id, rows, stamp))
            cursor.execute(
                *commit_with_grabs_sql(
                    activity_id=activity_id, rows=rows, decrement=row_locked, at=stamp
                )
            )
            finish_results(cursor)
        self.committed = True
        return True


def commit_with_grabs_sql(
    *, activity_id: int, rows: list[GrabRow], decrement: bool, at: datetime | None = None
) -> Statement:
    """`GrabTransaction.commit_with_grabs`' query on MySQL: with `decrement` the surplus
    UPDATE, then the INSERT and COMMIT, as one multi-statement query (mysqlclient allows them;
    its connections set CLIENT_MULTI_STATEMENTS). Run it through a cursor, then
    `finish_results`. `at`: the rows' created_at (now when None).

    The decrement has no condition beyond the primary key: MySQL runs the INSERT whatever the
    UPDATE matched, so only a row the transaction holds locked may be decremented this way."""
    insert, insert_params = insert_grab_rows_sql(activity_id=activity_id, rows=rows, at=at)
    if not decrement:
        return f"{insert}; COMMIT", insert_params
    take, take_params = batch_decrement_sql(activity_id=activity_id, rows=rows)
    return f"{take}; {insert}; COMMIT", take_params + insert_params


def batch_decrement_sql(*, activity_id: int, rows: list[GrabRow]) -> Statement:
    """The surplus decrement of a batch's rows, by primary key and nothing else
    (`take_from_surplus_sql`), as the batched writes send it."""
    return take_from_surplus_sql(
        activity_id=activity_id,
        count=len(rows),
        cents=sum(row.cents for row in rows),
        version=None,
        open_only=False,
    )


def claim_then_take_sql(*, activity_id: int, rows: list[GrabRow]) -> Statement:
    """A batch's first writes on MySQL, as one multi-statement query: the claim of its
    pre-split packets (`claim_packets_sql`; none without them), then the surplus decrement,
    which takes the activity's row (`batch_decrement_sql`): the lock order above, in one
    round trip. The decrement runs only when the claim took every packet (its row count, kept
    in a session variable by the statement between them): a claim that falls short leaves the
    activity's row untaken and its surplus as it was. Read the results with `claimed_all`;
    short, the caller rolls back the claim's part."""
    take, take_params = batch_decrement_sql(activity_id=activity_id, rows=rows)
    claims = claims_of(rows)
    if not claims:
        return take, take_params
    claim, claim_params = claim_packets_sql(activity_id=activity_id, rows=claims)
    # The decrement's statement ends with its WHERE conditions (take_from_surplus_sql).
    return (
        f"{claim}; SET @claimed = ROW_COUNT(); {take} AND @claimed = %s",
        [*claim_params, *take_params, len(claims)],
    )


def claimed_all(cursor: Any, rows: list[GrabRow]) -> bool:
    """After `claim_then_take_sql`'s query, the cursor on its first result: whether the claim
    took every pre-split packet of the rows (its row count). The later results are read too,
    an error of theirs raised here (`finish_results`). A claim that took them all is followed by a
    decrement that took the activity's row (the last result's row count); otherwise nothing
    of the batch may commit (RuntimeError): the COMMIT's query goes only while the row is
    held."""
    claims = len(claims_of(rows))
    claimed = cursor.rowcount if claims else 0
    taken = finish_results(cursor)
    if claimed != claims:
        return False
    if taken != 1:
        raise RuntimeError(f"the batch's decrement took {taken} activity rows, not one")
    return True


def finish_results(cursor: Any) -> int:
    """Read the replies of a multi-statement query's later statements: the error of one that
    failed is raised here, as Django's cursor raises it from execute (`next_result`). Returns
    the last statement's row count."""
    while next_result(cursor):
        pass
    return int(cursor.rowcount)


def next_result(cursor: Any) -> bool:
    """Move a Django cursor on to the next statement's result of its multi-statement query
    (False: there is none). That statement's error is raised here, as Django's cursor raises
    it from execute: wrapped, and a constraint MySQL reports as OperationalError raised as
    IntegrityError."""
    try:
        return bool(cursor.nextset())
    except OperationalError as exc:
        if dberrors.code(exc) in getattr(cursor, "codes_for_integrityerror", ()):
            raise IntegrityError(*exc.args) from exc
        raise


def refusal(
    activity: Activity, *, user_id: int | None, held: int | None = None
) -> GrabResult | None:
    """The answer when a loaded activity row cannot give this user a packet, else None.

    `user_id` None skips the dedupe lookup: the caller knows what the user holds (`held`, the
    cents of the user's grab, read with the row by `read_for_grab`) or that it holds nothing.
    Call it under the same protection as the decrement, so a grab never lands after close.
    """
    if activity.status != ActivityStatus.OPEN or activity.expires_at <= timezone.now():
        return GrabResult(Outcome.CLOSED)
    if user_id is not None:
        held = held_cents(activity_id=activity.pk, user_id=user_id)
    if held is not None:
        return GrabResult(Outcome.ALREADY_GRABBED, held)
    if activity.surplus_count <= 0:
        return GrabResult(Outcome.SOLD_OUT)
    return None


def read_for_grab(
    *, activity_id: int, user_id: int | None, lock: bool = True
) -> tuple[Activity, int | None]:
    """The activity row, locked (SELECT … FOR UPDATE) unless `lock` is off, and the cents of
    the user's grab if it has one (None: no user asked). On MySQL one raw statement (the lookup
    as a subquery, no queryset compiled), so it also runs inside `grab_transaction`; elsewhere
    the ORM's two. Activity.DoesNotExist when there is no such activity."""
    if connection.vendor != "mysql":
        rows = Activity.objects.select_for_update() if lock else Activity.objects.all()
        activity = rows.get(pk=activity_id)
        if user_id is None:
            return activity, None
        return activity, held_cents(activity_id=activity_id, user_id=user_id)
    with connection.cursor() as cursor:
        cursor.execute(*read_for_grab_sql(activity_id=activity_id, user_id=user_id, lock=lock))
        row = cursor.fetchone()
    activity, held = _activity_read(activity_id, row, locked=lock)
    return activity, None if held is None else to_cents(held)


# One member's grab in read_for_batch's list: user id, amount (a DECIMAL(12, 2) has two decimals).
_HELD_PAIR = re.compile(r"\d+:\d+\.\d\d")


def read_for_batch(*, activity_id: int, user_ids: list[int]) -> tuple[Activity, dict[int, int]]:
    """`read_for_grab` for a batch of users: the activity row, locked, and the cents of each of
    these users' grabs (those that have one). On MySQL one raw statement, the lookup as a
    subquery, so the batch's users are looked up under the lock in the same round trip; if the
    server cut the list short (group_concat_max_len), they are looked up again, still under
    the lock."""
    users = sorted({int(user_id) for user_id in user_ids})  # integers only, written inline
    if connection.vendor != "mysql" or not users:
        activity = Activity.objects.select_for_update().get(pk=activity_id)
        holds.taken()
        return activity, _held_cents_of(activity_id, users)
    among = f"d.activity_id = a.id AND d.user_id IN ({', '.join(map(str, users))})"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.status, a.expires_at, a.surplus_count, a.surplus_amount, a.allocation,"
            " a.version,"
            " (SELECT GROUP_CONCAT(d.user_id, ':', d.amount SEPARATOR ',')"
            f"   FROM {GrabDetail._meta.db_table} d WHERE {among}),"
            f" (SELECT COUNT(*) FROM {GrabDetail._meta.db_table} d WHERE {among})"
            f" FROM {Activity._meta.db_table} a WHERE a.id = %s FOR UPDATE",
            [activity_id],
        )
        row = cursor.fetchone()
    activity, held = _activity_read(activity_id, None if row is None else row[:-1], locked=True)
    pairs = held.split(",") if held else []
    if len(pairs) != row[-1] or not all(map(_HELD_PAIR.fullmatch, pairs)):  # cut short
        return activity, _held_cents_of(activity_id, users)
    holding: dict[int, int] = {}
    for pair in pairs:
        user, _, amount = pair.partition(":")
        holding[int(user)] = to_cents(amount)
    return activity, holding


def _held_cents_of(activity_id: int, users: list[int]) -> dict[int, int]:
    """The cents of these users' grabs of the activity, by user (read_for_batch's ORM read)."""
    if not users:
        return {}
    return {
        user: held.cents
        for user, held in held_marks(activity_id=activity_id, user_ids=users).items()
    }


def _activity_read(
    activity_id: int, row: tuple[Any, ...] | None, *, locked: bool
) -> tuple[Activity, Any]:
    """The activity of a `read_for_grab_sql`-shaped row, and the row's last column."""
    if locked:
        holds.taken()
    if row is None:
        raise Activity.DoesNotExist(f"activity {activity_id} does not exist")
    status, expires_at, surplus_count, surplus_amount, kind, version, held = row
    if timezone.is_naive(expires_at):
        expires_at = timezone.make_aware(expires_at, UTC)  # MySQL holds UTC, without a zone
    activity = Activity(
        pk=activity_id,
        status=status,
        expires_at=expires_at,
        surplus_count=surplus_count,
        surplus_amount=surplus_amount,
        allocation=kind,
        version=version,
    )
    return activity, held


def held_cents(*, activity_id: int, user_id: int) -> int | None:
    """What this user already grabbed from the activity, if anything."""
    amount = (
        GrabDetail.objects.filter(activity_id=activity_id, user_id=user_id)
        .values_list("amount", flat=True)
        .first()
    )
    return None if amount is None else to_cents(amount)


def held_marks(
    *, activity_id: int, user_ids: Iterable[int] | None = None, at: datetime | None = None
) -> dict[int, GrabRow]:
    """The grab rows MySQL holds for these users of the activity (every user when None); with
    `at`, only those written at that instant (created_at)."""
    rows = GrabDetail.objects.filter(activity_id=activity_id)
    if user_ids is not None:
        rows = rows.filter(user_id__in=set(user_ids))
    if at is not None:
        rows = rows.filter(created_at=at)
    return {
        user_id: GrabRow(user_id, to_cents(amount), packet_id)
        for user_id, amount, packet_id in rows.values_list("user_id", "amount", "redpack_id")
    }


def written_row(*, activity_id: int, user_id: int) -> GrabRow | None:
    """The user's grab row, read after a write whose outcome is unknown: its connection dropped,
    maybe during COMMIT, so the transaction may have committed or not (`_asked_after_doubt`).
    OutcomeUnknown when MySQL cannot be asked.

    Any row of the user answers: the Redis strategies' grab is their mark, whichever attempt
    writes it. A write whose user may have had another grab written since (another click's own
    transaction, in another process) asks `batch_written` instead."""
    return _asked_after_doubt(
        activity_id,
        lambda: held_marks(activity_id=activity_id, user_ids=[user_id]).get(user_id),
    )


def batch_written(*, activity_id: int, rows: list[GrabRow], at: datetime) -> bool:
    """Whether a transaction whose outcome is unknown wrote its `rows`, stamped `at`
    (GrabTransaction.inserted): its own rows, not the same users' rows of another transaction.

    A member's row alone proves nothing: once the transaction rolled back, the same user's
    other click (another process, its own transaction) may have written that user's grab, of
    the same amount when the amounts are equal. The transaction wrote all of its rows or none,
    each with its INSERT's created_at, taken while it held the activity's row: a transaction
    after it took the row later, so its clock reads later. OutcomeUnknown when MySQL cannot be
    asked, or holds some of the rows and not the others (no one transaction wrote that)."""
    users = [row.user_id for row in rows]

    def stamped() -> set[GrabRow]:
        return set(held_marks(activity_id=activity_id, user_ids=users, at=at).values())

    found = _asked_after_doubt(activity_id, stamped)
    if found == set(rows):
        return True
    if not found:
        return False
    raise OutcomeUnknown(
        f"MySQL holds {len(found)} of the {len(rows)} rows of a transaction cut off while"
        " committing; retry to learn the outcome"
    )


def _asked_after_doubt(activity_id: int, read: Callable[[], Result]) -> Result:
    """`read` after a write whose outcome is unknown, asked on a fresh connection behind the
    activity's row lock: a transaction the server is still committing holds that lock until it
    is done (every writer takes it before it inserts a detail, so before it commits; see the
    module docstring), so the answer is final. OutcomeUnknown when MySQL cannot be asked."""
    if connection.in_atomic_block:
        raise OutcomeUnknown("a grab's write failed inside an outer transaction")
    connection.close_if_unusable_or_obsolete()  # the one that failed: reconnect
    try:
        with shards.atomic():
            Activity.objects.select_for_update().filter(pk=activity_id).values_list("pk").first()
            return read()
    except DatabaseError as exc:
        raise OutcomeUnknown(
            "the grab's write was cut off and MySQL does not answer; retry to learn the outcome"
        ) from exc


def read_for_grab_sql(*, activity_id: int, user_id: int | None, lock: bool) -> Statement:
    """`read_for_grab`'s statement on MySQL."""
    return (
        "SELECT a.status, a.expires_at, a.surplus_count, a.surplus_amount, a.allocation,"
        " a.version,"
        f" (SELECT d.amount FROM {GrabDetail._meta.db_table} d"
        "   WHERE d.activity_id = a.id AND d.user_id = %s)"
        f" FROM {Activity._meta.db_table} a WHERE a.id = %s" + (" FOR UPDATE" if lock else ""),
        [user_id, activity_id],
    )


def after_duplicate(*, activity_id: int, user_id: int, error: IntegrityError) -> GrabResult:
    """The answer once inserting this user's grab row hit a constraint (its transaction rolled
    back): UNIQUE (activity, user) refused a second row, so the first one's amount; or the user
    itself does not exist (a signed token outliving its user), refused with 403 rather than
    answered as a grab. Any other constraint is a real error and propagates."""
    cents = held_cents(activity_id=activity_id, user_id=user_id)
    if cents is not None:
        return GrabResult(Outcome.ALREADY_GRABBED, cents)
    if not get_user_model().objects.filter(pk=user_id).exists():
        raise Forbidden(f"user {user_id} does not exist") from error
    raise error


def record_grab(
    *,
    activity_id: int,
    user_id: int,
    cents: int,
    version: int | None = None,
    open_only: bool = False,
    redpack_id: int | None = None,
) -> bool:
    """Take `cents` and one packet from the surplus, then insert the detail row (in that order,
    see the module docstring).

    Call it inside a transaction. The decrement is a conditional UPDATE: `version` fences it
    against any other write since the caller read the row; `open_only` refuses it once the
    activity is closed or expired. False when the condition failed and nothing was written by
    this call. IntegrityError from the insert means this user already holds a packet; the
    caller's transaction must roll back the decrement with it.
    """
    taken = take_from_surplus(
        activity_id=activity_id, count=1, cents=cents, version=version, open_only=open_only
    )
    if not taken:
        return False
    insert_grab_rows(activity_id=activity_id, rows=[GrabRow(user_id, cents, redpack_id)])
    return True


def insert_grab_rows(*, activity_id: int, rows: list[GrabRow]) -> None:
    """The detail rows of grabs whose surplus is taken (or taken in the same transaction, after
    the activity row was locked). On MySQL one raw multi-row INSERT (no model objects on the
    hot path); elsewhere bulk_create."""
    if connection.vendor == "mysql":
        stamp = timezone.now()
        transaction = _open_transaction.get()
        if transaction is not None:
            transaction.inserted.append((activity_id, rows, stamp))
        with connection.cursor() as cursor:
            cursor.execute(*insert_grab_rows_sql(activity_id=activity_id, rows=rows, at=stamp))
        return
    GrabDetail.objects.bulk_create(
        [
            GrabDetail(
                activity_id=activity_id,
                user_id=row.user_id,
                amount=from_cents(row.cents),
                redpack_id=row.packet_id,
            )
            for row in rows
        ]
    )


def insert_grab_rows_sql(
    *, activity_id: int, rows: list[GrabRow], at: datetime | None = None
) -> Statement:
    """`insert_grab_rows`'s statement on MySQL. Its values are integers, cents and the clock
    (`at`, now when None), written inline (`_inline`): a batch of hundreds of rows would
    otherwise spend more of its time escaping parameters one by one than MySQL spends inserting
    them."""
    stamp = timezone.now() if at is None else at
    now = _inline_datetime(connection.ops.adapt_datetimefield_value(stamp))
    activity = int(activity_id)
    values = ", ".join(
        f"({activity}, {int(row.user_id)}, {sql_decimal(row.cents)}, {_inline(row.packet_id)},"
        f" {now})"
        for row in rows
    )
    return (
        f"INSERT INTO {GrabDetail._meta.db_table}"
        f" (activity_id, user_id, amount, redpack_id, created_at) VALUES {values}",
        [],
    )


def _inline(value: int | None) -> str:
    """An id written into a statement: an integer or NULL, nothing else."""
    return "NULL" if value is None else str(int(value))


def _inline_datetime(value: str) -> str:
    """The backend's text for a datetime, quoted; only digits and separators can pass."""
    if not _DATETIME_TEXT.fullmatch(value):
        raise ValueError(f"not a datetime literal: {value!r}")
    return f"'{value}'"


_DATETIME_TEXT = re.compile(r"[0-9][0-9 :.-]*")


def record_grab_raw(
    cursor: Any,
    *,
    activity_id: int,
    row: GrabRow,
    version: int | None = None,
    open_only: bool = False,
) -> None:
    """`record_grab`'s two statements on a plain DB-API cursor (a strategy's raw_grab)."""
    cursor.execute(
        *take_from_surplus_sql(
            activity_id=activity_id, count=1, cents=row.cents, version=version, open_only=open_only
        )
    )
    cursor.execute(*insert_grab_rows_sql(activity_id=activity_id, rows=[row]))


def record_grabs(
    *, activity_id: int, rows: list[GrabRow], commit: GrabTransaction | None = None
) -> bool:
    """A batch's writes, as the Redis strategies' group commit makes them (redis_state/rows.py
    `write_grabs`): for pre-split packets one claim of them all, first, before the activity row
    (the lock order above: the row is held for the rest only); then the surplus once and the
    grab rows in one INSERT. False when a packet was not available: nothing of the batch may
    commit (nothing was decremented; without `commit` the caller's transaction must roll back,
    with it the transaction can only roll back). Call it inside a transaction; the
    request-time batches call it before their transaction holds the activity row (the
    persister's holds it already).

    `commit`: the grab_transaction it runs in, which then makes the writes and commits
    (`GrabTransaction.commit_with_grabs`: on MySQL the claim and the decrement, which takes the
    activity's row, in one round trip; one more, the INSERT and COMMIT together, releases it).
    The same statements as `commit_grabs_raw` (the `*_sql` functions), here through the
    service's connection, where the decrement also starts the row-lock hold's clock
    (holds.py)."""
    if commit is not None:
        return commit.commit_with_grabs(activity_id=activity_id, rows=rows)
    claims = claims_of(rows)
    if claims and not claim_packets(activity_id=activity_id, rows=claims):
        return False
    take_and_insert(activity_id=activity_id, rows=rows)
    return True


def take_and_insert(*, activity_id: int, rows: list[GrabRow]) -> None:
    """The rows' packets and cents taken from the surplus (one unconditional decrement), then
    the rows inserted: two statements, in the caller's transaction."""
    take_from_surplus(activity_id=activity_id, count=len(rows), cents=sum(r.cents for r in rows))
    insert_grab_rows(activity_id=activity_id, rows=rows)


def commit_grabs_raw(
    cursor: Any, *, activity_id: int, rows: list[GrabRow], begin: bool = False
) -> bool:
    """`record_grabs` with its `commit`, on a plain DB-API cursor (MySQL; a strategy's raw_grab
    or raw_batch) inside a transaction (`begin`: START TRANSACTION goes with its first
    statement, as grab_transaction sends it), without the service's meters: the claim and the
    surplus (which takes the activity's row) in one round trip, then the INSERT and COMMIT in
    one more. False when a packet was not available (nothing committed, nothing decremented:
    the caller rolls back the claim's part)."""
    execute_raw(cursor, claim_then_take_sql(activity_id=activity_id, rows=rows), begin=begin)
    if not claimed_all(cursor, rows):
        return False
    cursor.execute(*commit_with_grabs_sql(activity_id=activity_id, rows=rows, decrement=False))
    finish_results(cursor)
    return True


def execute_raw(cursor: Any, statement: Statement, *, begin: bool = False) -> None:
    """A statement on a plain DB-API cursor (MySQL); with `begin`, a transaction's first, sent
    after START TRANSACTION in one query as grab_transaction sends it, the cursor moved on to
    its result."""
    sql, params = statement
    if not begin:
        cursor.execute(sql, params)
        return
    cursor.execute(started_with(sql), params)
    cursor.nextset()


def started_with(sql: str) -> str:
    """A transaction's first statement as grab_transaction sends it: after START TRANSACTION,
    in one query (the cursor then moves on to the statement's result)."""
    return f"START TRANSACTION; {sql}"


def take_from_surplus(
    *,
    activity_id: int,
    count: int,
    cents: int,
    version: int | None = None,
    open_only: bool = False,
) -> int:
    """The conditional decrement of `count` packets worth `cents`; on MySQL by primary key,
    forced. Returns the rows updated (0: the condition failed, nothing written).

    On a small table MySQL's optimizer may run `WHERE id=? AND status='open' AND expires_at > ?`
    through the (status, expires_at) index and lock that entry before the row; close() rewrites
    the entry when it flips the status, and the two deadlock (test_close_race.py caught it).
    Django cannot hint an index, hence the raw statement. Elsewhere (the SQLite fallback) the
    ORM runs it, with money.minus keeping the DECIMAL exact.
    """
    if connection.vendor != "mysql":
        surplus = Activity.objects.filter(pk=activity_id)
        if version is not None:
            surplus = surplus.filter(version=version)
        if open_only:
            surplus = surplus.filter(status=ActivityStatus.OPEN, expires_at__gt=timezone.now())
        return surplus.update(
            surplus_count=F("surplus_count") - count,
            surplus_amount=minus("surplus_amount", cents),
            version=F("version") + 1,
        )
    with connection.cursor() as cursor:
        cursor.execute(
            *take_from_surplus_sql(
                activity_id=activity_id,
                count=count,
                cents=cents,
                version=version,
                open_only=open_only,
            )
        )
        holds.taken()
        return cursor.rowcount


def take_from_surplus_sql(
    *, activity_id: int, count: int, cents: int, version: int | None, open_only: bool
) -> Statement:
    """`take_from_surplus`'s statement on MySQL."""
    conditions = ["id = %s"]
    params: list[Any] = [count, from_cents(cents), activity_id]
    if version is not None:
        conditions.append("version = %s")
        params.append(version)
    if open_only:
        conditions.append("status = %s AND expires_at > %s")
        params += [
            ActivityStatus.OPEN.value,
            connection.ops.adapt_datetimefield_value(timezone.now()),
        ]
    return (
        f"UPDATE {Activity._meta.db_table} FORCE INDEX (PRIMARY)"
        " SET surplus_count = surplus_count - %s, surplus_amount = surplus_amount - %s,"
        f" version = version + 1 WHERE {' AND '.join(conditions)}",
        params,
    )


def claim_packet(*, packet_id: int, user_id: int, version: int | None = None) -> bool:
    """Mark a pre-split packet taken if it is still available (and, when given, still at
    `version` since it was read). On MySQL one raw UPDATE; elsewhere the ORM's.

    It takes no lock on the activity row (the module docstring); the preallocating strategies
    call it under that row's lock, after their checks of the activity (preallocated.py).
    """
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(*claim_packet_sql(packet_id=packet_id, user_id=user_id, version=version))
            return cursor.rowcount == 1
    packet = Packet.objects.filter(pk=packet_id, status=PacketStatus.AVAILABLE)
    if version is not None:
        packet = packet.filter(version=version)
    return bool(
        packet.update(status=PacketStatus.TAKEN, grabbed_by_id=user_id, version=F("version") + 1)
    )


def claim_packet_sql(*, packet_id: int, user_id: int, version: int | None) -> Statement:
    """`claim_packet`'s statement on MySQL."""
    conditions = "id = %s AND status = %s" + ("" if version is None else " AND version = %s")
    params = [PacketStatus.TAKEN.value, user_id, packet_id, PacketStatus.AVAILABLE.value]
    return (
        f"UPDATE {Packet._meta.db_table} SET status = %s, grabbed_by_id = %s,"
        f" version = version + 1 WHERE {conditions}",
        params if version is None else [*params, version],
    )


def claim_packets(*, activity_id: int, rows: list[GrabRow]) -> bool:
    """`claim_packet` for a batch, in one UPDATE: True when every row's packet is one of the
    activity's, was available at that amount and is now taken by its user; False when any was
    not (the caller's transaction must then roll back).

    The packets are the batch's alone (Redis popped them), so it runs before the activity row
    is taken (the module docstring's lock order): first in `record_grabs`, and on the request
    path in the decrement's query (`claim_then_take_sql`). On MySQL one
    raw statement (`claim_packets_sql`); elsewhere the ORM's equivalent.
    """
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(*claim_packets_sql(activity_id=activity_id, rows=rows))
            return cursor.rowcount == len(rows)
    matching = Q()
    for row in rows:
        matching |= Q(pk=row.packet_id, amount=from_cents(row.cents))
    updated = Packet.objects.filter(
        matching, activity_id=activity_id, status=PacketStatus.AVAILABLE
    ).update(
        status=PacketStatus.TAKEN,
        grabbed_by_id=Case(*[When(pk=row.packet_id, then=Value(row.user_id)) for row in rows]),
        version=F("version") + 1,
    )
    return updated == len(rows)


def claim_packets_sql(*, activity_id: int, rows: list[GrabRow]) -> Statement:
    """`claim_packets`'s statement on MySQL: the packets joined, by primary key, to the batch's
    (packet, user, amount) rows, inline (`_inline`). One pass over the batch, where
    `CASE id WHEN … END` per column cost MySQL time in the square of the batch's size."""
    chosen = " UNION ALL ".join(
        f"SELECT {_inline(row.packet_id)} AS id, {int(row.user_id)} AS user_id,"
        f" {sql_decimal(row.cents)} AS amount"
        for row in rows
    )
    return (
        f"UPDATE {Packet._meta.db_table} p JOIN ({chosen}) chosen ON p.id = chosen.id"
        " SET p.status = %s, p.grabbed_by_id = chosen.user_id, p.version = p.version + 1"
        " WHERE p.activity_id = %s AND p.status = %s AND p.amount = chosen.amount",
        [PacketStatus.TAKEN.value, activity_id, PacketStatus.AVAILABLE.value],
    )


def close_row_locked(*, activity_id: int) -> CloseResult:
    """Close under the activity's row lock; idempotent. Call it inside a transaction.

    A grab that already decremented holds the row lock until it commits, so the remainder read
    here includes it; a grab that has not yet decremented waits for this one to commit and then
    finds the activity closed (or its version moved).
    """
    activity = Activity.objects.select_for_update().get(pk=activity_id)
    if activity.status == ActivityStatus.OPEN:
        Activity.objects.filter(pk=activity_id).update(
            status=ActivityStatus.CLOSED, version=F("version") + 1
        )
    return CloseResult(activity.surplus_count, to_cents(activity.surplus_amount))


def split_into_packets(activity: Activity) -> None:
    """Cut the activity into its packets at send time (t_redpack), for pre-allocating strategies."""
    amounts = allocation.split(
        activity.allocation, to_cents(activity.total_amount), activity.total_count
    )
    Packet.objects.bulk_create(
        [Packet(activity=activity, amount=from_cents(cents)) for cents in amounts],
        batch_size=1000,
    )
