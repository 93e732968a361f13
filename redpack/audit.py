"""The auditor: checks the invariants of docs/design.md for one activity, once writes settled,
and the books (redpack/ledger.py) as a whole."""

from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Count, F, Q, Sum

from strategies import registry

from . import shards
from .models import (
    Account,
    AccountKind,
    Activity,
    ActivityStatus,
    EntryKind,
    GrabDetail,
    JournalEntry,
    JournalLine,
    Packet,
    PacketStatus,
    Refund,
)
from .money import from_cents, to_cents, total


@dataclass
class Checks:
    checks: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def check(self, name: str, passed: bool, violation: str) -> None:
        self.checks.append(name)
        if not passed:
            self.violations.append(violation)


@dataclass
class AuditReport(Checks):
    activity_id: int = 0
    strategy: str = ""
    grabbed: int = 0
    oversold: int = 0  # packets handed out beyond what the activity holds
    duplicates: int = 0  # users holding more than one packet (or told `grabbed` twice)
    uncredited: int = 0  # grabs whose amount has not reached the grabber's wallet yet


@dataclass
class BooksReport(Checks):
    entries: int = 0
    accounts: int = 0
    uncredited: int = 0
    uncredited_unowed: int = 0  # of those, grabs of strategies whose packets may be invented


@contextmanager
def _snapshot() -> Iterator[None]:
    """Every MySQL read inside, of the current activity's database (shards.py), sees it as of
    the first one: one REPEATABLE READ transaction (this one only; the connection stays READ
    COMMITTED), which takes no lock.

    An activity can be audited while it is grabbed: read statement by statement, a grab
    committed between the activity's row and the count of its grabs would look like an oversold
    packet. Inside a transaction already (a test's), or on SQLite (whose transactions here take
    the write lock up front), the reads run as they are."""
    connection = shards.connection  # the current activity's database
    if connection.vendor != "mysql" or connection.in_atomic_block:
        yield
        return
    with shards.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        try:
            yield
        finally:  # it only read: it ends by ROLLBACK, nothing to commit
            transaction.set_rollback(True, using=shards.current())


def audit_activity(
    activity: Activity, *, answers: list[tuple[int, int]] | None = None
) -> AuditReport:
    """`answers`: every (user_id, amount_cents) that was told `grabbed`, when the caller knows.

    The activity is read again, with everything else of its database, from one snapshot of it
    (`_snapshot`)."""
    with shards.for_activity(activity.pk), _snapshot():
        return _audit_activity(Activity.objects.get(pk=activity.pk), answers)


def _audit_activity(activity: Activity, answers: list[tuple[int, int]] | None) -> AuditReport:
    report = AuditReport(activity_id=activity.pk, strategy=activity.strategy)
    details = GrabDetail.objects.filter(activity=activity)
    totals = details.aggregate(n=Count("id"), cents=Sum("amount"))
    grabbed_count = totals["n"]
    grabbed_cents = to_cents(totals["cents"] or 0)
    refund = Refund.objects.filter(activity=activity).first()
    refunded_count = refund.count if refund else 0
    refunded_cents = to_cents(refund.amount) if refund else 0
    surplus_cents = to_cents(activity.surplus_amount)
    report.grabbed = grabbed_count

    accounted = grabbed_count + activity.surplus_count + refunded_count
    report.oversold = max(0, accounted - activity.total_count, grabbed_count - activity.total_count)
    report.check(
        "count: grabbed + surplus + refunded = total",
        accounted == activity.total_count,
        f"count: {grabbed_count} grabbed + {activity.surplus_count} surplus + {refunded_count} "
        f"refunded = {accounted}, total is {activity.total_count}",
    )
    total_cents = to_cents(activity.total_amount)
    accounted_cents = grabbed_cents + surplus_cents + refunded_cents
    report.check(
        "amount: grabbed + surplus + refunded = total",
        accounted_cents == total_cents,
        f"amount: {grabbed_cents} + {surplus_cents} + {refunded_cents} = {accounted_cents} cents,"
        f" total is {total_cents}",
    )

    doubled = list(
        details.values("user_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .values_list("user_id", flat=True)
    )
    report.duplicates = len(doubled)
    report.check("one packet per user", not doubled, f"users holding two packets: {doubled[:10]}")

    tiny = details.filter(amount__lt="0.01").count()
    report.check("every packet >= 0.01", tiny == 0, f"{tiny} grabs below 0.01")

    _audit_packets(activity, report)
    _audit_refund(activity, refund, surplus_cents, report)
    _audit_escrow(activity, grabbed_cents, refunded_cents, report)
    if answers is not None:
        _audit_answers(activity, answers, report)
    strategy_violations = registry.get(activity.strategy).audit(activity)
    report.check(
        f"{activity.strategy}: own invariants",
        not strategy_violations,
        "; ".join(strategy_violations),
    )
    return report


def _audit_packets(activity: Activity, report: AuditReport) -> None:
    """Pre-split amounts are consumed as a multiset, never invented."""
    packets = Packet.objects.filter(activity=activity)
    if not packets.exists():
        report.check(
            "no pre-split packet is referenced",
            not GrabDetail.objects.filter(activity=activity, redpack__isnull=False).exists(),
            "grabs point at packets the activity does not have",
        )
        return
    all_packets = packets.aggregate(n=Count("id"), cents=Sum("amount"))
    report.check(
        "packets sum to the total",
        all_packets["n"] == activity.total_count
        and to_cents(all_packets["cents"]) == to_cents(activity.total_amount),
        f"packets: {all_packets['n']} worth {all_packets['cents']}, activity is "
        f"{activity.total_count} worth {activity.total_amount}",
    )
    mismatched = (
        GrabDetail.objects.filter(activity=activity)
        .exclude(
            Q(redpack__activity=activity)
            & Q(redpack__status=PacketStatus.TAKEN)
            & Q(redpack__amount=F("amount"))
            & Q(redpack__grabbed_by=F("user"))
        )
        .count()
    )
    report.check(
        "every grab consumed one packet of its amount",
        mismatched == 0,
        f"{mismatched} grabs do not match a taken packet of the same amount and user",
    )
    taken = packets.filter(status=PacketStatus.TAKEN).count()
    report.check(
        "taken packets = grabs",
        taken == report.grabbed,
        f"{taken} packets taken but {report.grabbed} grabs recorded",
    )
    if activity.status == ActivityStatus.OPEN:
        available = packets.filter(status=PacketStatus.AVAILABLE).aggregate(
            n=Count("id"), cents=Sum("amount")
        )
        report.check(
            "available packets = surplus",
            available["n"] == activity.surplus_count
            and to_cents(available["cents"] or 0) == to_cents(activity.surplus_amount),
            f"available packets {available['n']} worth {available['cents']}, surplus "
            f"{activity.surplus_count} worth {activity.surplus_amount}",
        )


def _audit_refund(
    activity: Activity, refund: Refund | None, surplus_cents: int, report: AuditReport
) -> None:
    if refund is None:
        report.check(
            "refunded activity has its refund record",
            activity.status != ActivityStatus.REFUNDED,
            "status is refunded but no refund record exists",
        )
        return
    report.check(
        "refund took all that was left",
        activity.surplus_count == 0 and surplus_cents == 0,
        f"refund recorded but {activity.surplus_count} packets worth {surplus_cents} cents remain",
    )


def _audit_escrow(
    activity: Activity, grabbed_cents: int, refunded_cents: int, report: AuditReport
) -> None:
    """The activity's money: escrow = total − credited − refunded, credited ≤ grabbed."""
    escrow = Account.objects.filter(activity=activity).first()
    report.check(
        "the send moved the total into an escrow",
        escrow is not None,
        "the activity has no escrow: it was sent without money",
    )
    if escrow is None:
        return
    if shards.ledger_is_apart():  # the grab rows here, the credit entries on default
        amounts = dict(GrabDetail.objects.filter(activity=activity).values_list("pk", "amount"))
        entries = JournalEntry.objects.filter(kind=EntryKind.CREDIT, activity_id=activity.pk)
        paid = [amounts[g] for g in entries.values_list("grab_id", flat=True) if g in amounts]
        credited_count, credited_cents = len(paid), sum(to_cents(amount) for amount in paid)
    else:
        credited = GrabDetail.objects.filter(activity=activity, credit__isnull=False).aggregate(
            n=Count("pk"), cents=Sum("amount")
        )
        credited_count, credited_cents = credited["n"], to_cents(credited["cents"] or 0)
    report.uncredited = report.grabbed - credited_count
    expected = to_cents(activity.total_amount) - credited_cents - refunded_cents
    report.check(
        "escrow = total − credited − refunded",
        to_cents(escrow.balance) == expected,
        f"escrow holds {escrow.balance}, total − credited − refunded is {from_cents(expected)}",
    )
    report.check(
        "credited ≤ grabbed",
        credited_cents <= grabbed_cents,
        f"credited {from_cents(credited_cents)} of {from_cents(grabbed_cents)} grabbed",
    )


def audit_books(*, drained: bool = False, unowed: Collection[str] = ()) -> BooksReport:
    """The ledger as a whole. `drained`: the crediting task has caught up, so every grab of an
    activity with an escrow must be credited, except those of the `unowed` strategies (the
    unsafe baseline oversells: its invented packets have no money in the escrow, so the books
    rightly never credit them; the activity's own audit reports the oversell)."""
    report = BooksReport(entries=JournalEntry.objects.count(), accounts=Account.objects.count())
    unbalanced = (
        JournalEntry.objects.annotate(n=Count("lines"), total=total("lines__amount"))
        .exclude(n__gte=2, total=0)
        .values_list("pk", flat=True)
    )
    unbalanced_ids = list(unbalanced[:10])
    report.check(
        "every entry has lines that sum to 0",
        not unbalanced_ids,
        f"entries whose lines do not sum to 0: {unbalanced_ids}",
    )
    balances = Account.objects.aggregate(total=total("balance"))["total"]
    report.check(
        "wallets + escrows + funding = 0",
        to_cents(balances) == 0,
        f"the accounts' balances sum to {balances}",
    )
    drifted = list(
        Account.objects.annotate(lines_total=total("lines__amount"))
        .exclude(balance=F("lines_total"))
        .values_list("pk", flat=True)[:10]
    )
    report.check(
        "every balance is the sum of its lines",
        not drifted,
        f"accounts whose balance is not the sum of their lines: {drifted}",
    )
    negative = Account.objects.exclude(kind=AccountKind.FUNDING).filter(balance__lt=0).count()
    report.check("no wallet or escrow below 0", negative == 0, f"{negative} accounts below 0")
    fundings = Account.objects.filter(kind=AccountKind.FUNDING).count()
    report.check("one funding account", fundings <= 1, f"{fundings} funding accounts")
    if shards.enabled():
        crossing = _across_shards(unowed)
        report.check(
            "every escrow's activity exists",
            not crossing.orphans,
            f"funded escrows whose activity is on no shard: {crossing.orphans[:10]}",
        )
    else:
        crossing = _in_one_database(unowed)
    report.check(
        "each credit moves its grab's amount from its escrow to its grabber",
        crossing.wrong_credits == 0,
        f"{crossing.wrong_credits} credit lines do not match their grab row",
    )
    report.check(
        "each refund moves its record's amount from its escrow to its sender",
        crossing.wrong_refunds == 0,
        f"{crossing.wrong_refunds} refund lines do not match their refund record",
    )
    twice = (
        JournalEntry.objects.filter(kind=EntryKind.CREDIT)
        .values("grab_id")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
        .count()
    )
    report.check("each grab credited at most once", twice == 0, f"{twice} grabs credited twice")
    report.uncredited, report.uncredited_unowed = crossing.uncredited, crossing.uncredited_unowed
    if drained:
        owed = report.uncredited - report.uncredited_unowed
        report.check("every grab credited", owed == 0, f"{owed} grabs not credited")
    return report


@dataclass
class Crossing:
    """What the books say against the activity side: lines that do not match their grab row or
    refund record, grabs of funded activities not credited (of them, the `unowed` strategies'),
    and escrows whose activity exists nowhere (sharded only: one database has a foreign key)."""

    wrong_credits: int
    wrong_refunds: int
    uncredited: int
    uncredited_unowed: int
    orphans: list[int] = field(default_factory=list)


def _in_one_database(unowed: Collection[str]) -> Crossing:
    uncredited = GrabDetail.objects.filter(credit__isnull=True, activity__escrow__isnull=False)
    return Crossing(
        wrong_credits=_misbooked(
            EntryKind.CREDIT,
            source="entry__grab__activity_id",
            target="entry__grab__user_id",
            amount="entry__grab__amount",
        ),
        wrong_refunds=_misbooked(
            EntryKind.REFUND,
            source="entry__refund__activity_id",
            target="entry__refund__activity__sender_id",
            amount="entry__refund__amount",
        ),
        uncredited=uncredited.count(),
        uncredited_unowed=(
            uncredited.filter(activity__strategy__in=unowed).count() if unowed else 0
        ),
    )


def _across_shards(unowed: Collection[str]) -> Crossing:
    """`_in_one_database`'s figures while sharded: every shard's grab rows and refund records
    are read (not joined) and matched to the journal's lines in memory."""
    strategies: dict[int, str] = {}
    senders: dict[int, int] = {}
    grabs: dict[int, tuple[int, int, int]] = {}  # id -> (activity, user, cents)
    refunds: dict[int, tuple[int, int, int]] = {}  # id -> (activity, sender, cents)
    for _ in shards.each():
        for pk, strategy, sender in Activity.objects.values_list("pk", "strategy", "sender_id"):
            strategies[pk], senders[pk] = strategy, sender
        for pk, activity, user, amount in GrabDetail.objects.values_list(
            "pk", "activity_id", "user_id", "amount"
        ).iterator(chunk_size=5000):
            grabs[pk] = (activity, user, to_cents(amount))
        for pk, activity, amount in Refund.objects.values_list("pk", "activity_id", "amount"):
            refunds[pk] = (activity, senders[activity], to_cents(amount))
    escrows = set(
        Account.objects.filter(kind=AccountKind.ESCROW).values_list("activity_id", flat=True)
    )

    def wrong(kind: str, records: dict[int, tuple[int, int, int]], key: str) -> int:
        lines = JournalLine.objects.filter(entry__kind=kind).values_list(
            key, "account__activity_id", "account__user_id", "amount"
        )
        count = 0
        for record, escrow_of, wallet_of, amount in lines.iterator(chunk_size=5000):
            activity, user, cents = records.get(record, (None, None, None))
            moved = to_cents(amount)
            if moved < 0:
                count += not (escrow_of == activity and -moved == cents)
            else:
                count += not (wallet_of == user and moved == cents)
        return count

    credited = set(
        JournalEntry.objects.filter(kind=EntryKind.CREDIT).values_list("grab_id", flat=True)
    )
    uncredited = [a for pk, (a, _, _) in grabs.items() if pk not in credited and a in escrows]
    return Crossing(
        wrong_credits=wrong(EntryKind.CREDIT, grabs, "entry__grab_id"),
        wrong_refunds=wrong(EntryKind.REFUND, refunds, "entry__refund_id"),
        uncredited=len(uncredited),
        uncredited_unowed=sum(strategies[a] in unowed for a in uncredited),
        orphans=sorted(escrows - strategies.keys()),
    )


def _misbooked(kind: str, *, source: str, target: str, amount: str) -> int:
    """Lines of `kind` entries that do not take `amount` out of the escrow of activity `source`
    and put it into the wallet of user `target` (each a path from the line)."""
    lines = JournalLine.objects.filter(entry__kind=kind)
    into = lines.filter(amount__gt=0).exclude(account__user_id=F(target), amount=F(amount))
    out_of = lines.filter(amount__lt=0).exclude(account__activity_id=F(source), amount=-F(amount))
    return into.count() + out_of.count()


def _audit_answers(activity: Activity, answers: list[tuple[int, int]], report: AuditReport) -> None:
    """Every `grabbed` answer is a row with that amount; no row exists that nobody was told of."""
    told = Counter(user_id for user_id, _ in answers)
    twice = [user_id for user_id, n in told.items() if n > 1]
    report.duplicates = max(report.duplicates, len(twice))
    report.check("nobody told `grabbed` twice", not twice, f"told grabbed twice: {twice[:10]}")
    rows = {
        user_id: to_cents(amount)
        for user_id, amount in GrabDetail.objects.filter(activity=activity).values_list(
            "user_id", "amount"
        )
    }
    answered = dict(answers)
    missing = [u for u, cents in answered.items() if rows.get(u) != cents]
    unannounced = [u for u in rows if u not in answered]
    report.check(
        "every `grabbed` answer is a row with that amount",
        not missing,
        f"{len(missing)} grabbed answers have no matching row, e.g. users {missing[:10]}",
    )
    report.check(
        "every row was announced as `grabbed`",
        not unannounced,
        f"{len(unannounced)} rows nobody was told of, e.g. users {unannounced[:10]}",
    )
