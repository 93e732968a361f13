"""The auditor: checks the invariants of docs/design.md for one activity, once writes settled."""

from collections import Counter
from dataclasses import dataclass, field

from django.db.models import Count, F, Q, Sum

from strategies import registry

from .models import Activity, ActivityStatus, GrabDetail, Packet, PacketStatus, Refund
from .money import to_cents


@dataclass
class AuditReport:
    activity_id: int
    strategy: str
    grabbed: int = 0
    oversold: int = 0  # packets handed out beyond what the activity holds
    duplicates: int = 0  # users holding more than one packet (or told `grabbed` twice)
    checks: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def check(self, name: str, passed: bool, violation: str) -> None:
        self.checks.append(name)
        if not passed:
            self.violations.append(violation)


def audit_activity(
    activity: Activity, *, answers: list[tuple[int, int]] | None = None
) -> AuditReport:
    """`answers`: every (user_id, amount_cents) that was told `grabbed`, when the caller knows."""
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
