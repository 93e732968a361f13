"""Data and constraints. Table names follow the seeds; money is DECIMAL(12, 2)."""

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from .allocation import Allocation

ONE_CENT = Decimal("0.01")


def money_field() -> "models.DecimalField[Decimal, Decimal]":
    return models.DecimalField(max_digits=12, decimal_places=2)


class ActivityStatus(models.TextChoices):
    OPEN = "open"
    CLOSED = "closed"
    REFUNDED = "refunded"


class Activity(models.Model):
    """One red packet as sent; surplus_* is what is still there to grab."""

    sender = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="sent_activities"
    )
    total_amount = money_field()
    surplus_amount = money_field()
    total_count = models.PositiveIntegerField()
    surplus_count = models.PositiveIntegerField()
    strategy = models.CharField(max_length=32)
    allocation = models.CharField(
        max_length=16, choices=[(a.value, a.value.replace("_", " ")) for a in Allocation]
    )
    status = models.CharField(
        max_length=10, choices=ActivityStatus.choices, default=ActivityStatus.OPEN
    )
    version = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "t_redpack_activity"
        verbose_name_plural = "activities"
        permissions = [("expire_activity", "Can expire an activity now and refund its sender")]
        indexes = [models.Index(fields=["status", "expires_at"], name="activity_status_expiry")]
        constraints = [
            models.CheckConstraint(condition=Q(total_count__gte=1), name="activity_count_min"),
            models.CheckConstraint(
                condition=Q(total_amount__gte=F("total_count") * ONE_CENT),
                name="activity_total_covers_count",
            ),
            models.CheckConstraint(
                condition=Q(surplus_count__lte=F("total_count")), name="activity_surplus_count"
            ),
            models.CheckConstraint(
                condition=Q(surplus_amount__gte=F("surplus_count") * ONE_CENT)
                & Q(surplus_amount__lte=F("total_amount")),
                name="activity_surplus_amount",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.total_amount} × {self.total_count} ({self.strategy})"


class ActivityId(models.Model):
    """Activity ids while sharded (redpack/shards.py): one row per id, allocated on the ledger
    database before the activity is written to its shard, so ids are unique over the shards."""

    class Meta:
        db_table = "t_redpack_activity_id"

    def __str__(self) -> str:
        return f"activity id {self.pk}"


class PacketStatus(models.IntegerChoices):
    AVAILABLE = 1
    TAKEN = 2


class Packet(models.Model):
    """A packet cut at send time, for the pre-allocating strategies (seed 001's 红包表)."""

    activity = models.ForeignKey(Activity, on_delete=models.CASCADE, related_name="packets")
    amount = money_field()
    status = models.PositiveSmallIntegerField(
        choices=PacketStatus.choices, default=PacketStatus.AVAILABLE
    )
    version = models.BigIntegerField(default=0)
    grabbed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        db_table = "t_redpack"
        # The foreign key to the activity has an index of its own, first (migration 0006): a
        # claim changes the status, not the key's index, so it does not lock the activity row.
        indexes = [
            models.Index(fields=["activity"], name="packet_activity"),
            models.Index(fields=["activity", "status"], name="packet_activity_status"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gte=ONE_CENT), name="packet_amount_min"),
            models.CheckConstraint(
                condition=Q(status=PacketStatus.AVAILABLE, grabbed_by__isnull=True)
                | Q(status=PacketStatus.TAKEN, grabbed_by__isnull=False),
                name="packet_taken_has_owner",
            ),
        ]

    def __str__(self) -> str:
        return f"packet #{self.pk} {self.amount} of activity {self.activity_id}"


class GrabDetail(models.Model):
    """One successful grab (明细表). UNIQUE (activity, user) is the last line of the dedupe."""

    activity = models.ForeignKey(Activity, on_delete=models.CASCADE, related_name="details")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    amount = money_field()
    redpack = models.ForeignKey(Packet, null=True, blank=True, on_delete=models.PROTECT)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "t_redpack_detail"
        indexes = [models.Index(fields=["user", "-created_at"], name="detail_user_recent")]
        constraints = [
            models.UniqueConstraint(fields=["activity", "user"], name="detail_one_per_user"),
            models.CheckConstraint(condition=Q(amount__gte=ONE_CENT), name="detail_amount_min"),
        ]

    def __str__(self) -> str:
        return f"user {self.user_id} got {self.amount} from activity {self.activity_id}"


class Refund(models.Model):
    """What went back to the sender when the activity closed; at most one per activity."""

    activity = models.OneToOneField(Activity, on_delete=models.CASCADE, related_name="refund")
    amount = money_field()
    count = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "t_redpack_refund"
        constraints = [
            models.CheckConstraint(condition=Q(amount__gte=0), name="refund_amount_nonneg"),
        ]

    def __str__(self) -> str:
        return f"refund of {self.amount} ({self.count} packets) for activity {self.activity_id}"


class PersistFailureStatus(models.TextChoices):
    RETRYING = "retrying"  # still in the persist stream; the persister tries it again
    DEAD = "dead"  # left the stream after too many attempts; only a retry from the admin helps
    RESOLVED = "resolved"  # in MySQL now


# Failed grabs that are not yet in MySQL: their activity is not settled.
UNRESOLVED_FAILURES = (PersistFailureStatus.RETRYING, PersistFailureStatus.DEAD)


class PersistFailure(models.Model):
    """A grab of redis_queue_async that failed to reach MySQL on its own (its persister).

    The user was told `grabbed`: until the grab is in MySQL, its activity is not settled and is
    not refunded. One row per stream entry, however often it failed.
    """

    activity = models.ForeignKey(Activity, on_delete=models.CASCADE, related_name="+")
    entry_id = models.CharField(max_length=40)  # the stream entry's id, e.g. 1700000000000-0
    payload = models.JSONField()  # the stream entry's fields as the grab wrote them
    user_id = models.BigIntegerField()  # no foreign key: a missing user can be the failure
    amount = money_field()
    packet_id = models.BigIntegerField(null=True)
    error = models.TextField()
    attempts = models.PositiveIntegerField(default=0)
    status = models.CharField(
        max_length=10,
        choices=PersistFailureStatus.choices,
        default=PersistFailureStatus.RETRYING,
    )
    first_failed_at = models.DateTimeField(auto_now_add=True)
    last_failed_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "t_redpack_persist_failure"
        permissions = [("retry_persistfailure", "Can retry a grab that failed to persist")]
        indexes = [models.Index(fields=["status", "activity"], name="persist_failure_status")]
        constraints = [
            models.UniqueConstraint(fields=["activity", "entry_id"], name="persist_failure_entry"),
        ]

    def __str__(self) -> str:
        return f"grab {self.entry_id} of activity {self.activity_id} by user {self.user_id}"


def ledger_field(**kwargs: Any) -> "models.DecimalField[Decimal, Decimal]":
    """Balances and journal lines: wider than one activity's amount (the funding account holds
    minus every deposit ever made), same two decimals."""
    return models.DecimalField(max_digits=18, decimal_places=2, **kwargs)


def activity_side(to: type[models.Model], *, related_name: str) -> "models.OneToOneField[Any]":
    """A ledger row's link to at most one row of the activity side, by id and without a foreign
    key constraint: while sharded (redpack/shards.py) that side lives in other databases."""
    return models.OneToOneField(
        to,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        db_constraint=False,
        related_name=related_name,
    )


class AccountKind(models.TextChoices):
    WALLET = "wallet"  # a user's money; never negative
    ESCROW = "escrow"  # an activity's money between the send and its grabs or refund
    FUNDING = "funding"  # the platform's one account: deposits come from it; may go negative


class Account(models.Model):
    """One account of the double-entry ledger. Its balance is kept in step with its journal
    lines in the transaction that posts them (the auditor checks it is their sum)."""

    kind = models.CharField(max_length=8, choices=AccountKind.choices)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="wallet",
    )
    activity = activity_side(Activity, related_name="escrow")
    balance = ledger_field(default=Decimal("0.00"))

    class Meta:
        db_table = "t_redpack_account"
        permissions = [("deposit", "Can deposit into a wallet from the funding account")]
        indexes = [models.Index(fields=["kind", "balance"], name="account_kind_balance")]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind=AccountKind.FUNDING) | Q(balance__gte=0),
                name="account_balance_nonneg",
            ),
            models.CheckConstraint(
                condition=Q(kind=AccountKind.WALLET, user__isnull=False, activity__isnull=True)
                | Q(kind=AccountKind.ESCROW, user__isnull=True, activity__isnull=False)
                | Q(kind=AccountKind.FUNDING, user__isnull=True, activity__isnull=True),
                name="account_owner_of_kind",
            ),
        ]

    def __str__(self) -> str:
        if self.kind == AccountKind.WALLET:
            return f"wallet of user {self.user_id}"
        if self.kind == AccountKind.ESCROW:
            return f"escrow of activity {self.activity_id}"
        return "platform funding"


class EntryKind(models.TextChoices):
    DEPOSIT = "deposit"  # funding -> wallets
    SEND = "send"  # sender's wallet -> the activity's escrow
    CREDIT = "credit"  # escrow -> a grabber's wallet, one entry per grab row
    REFUND = "refund"  # escrow -> sender's wallet, the refund record's amount
    OPENING = "opening"  # funding -> escrow of an activity sent before the ledger existed


class Immutable(models.Model):
    """Written once, never changed: the journal."""

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ValueError(f"{self._meta.verbose_name_plural} are immutable")
        super().save(*args, **kwargs)


class JournalEntry(Immutable):
    """One movement of money, immutable; its lines sum to 0. A credit is tied to its grab row
    and a refund to its refund record by a UNIQUE key: each is booked at most once."""

    kind = models.CharField(max_length=8, choices=EntryKind.choices)
    # No foreign key constraint: a crediting insert must not take a shared lock on the hot
    # activity row, which the row-locking strategies hold for every grab.
    activity = models.ForeignKey(
        Activity,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    grab = activity_side(GrabDetail, related_name="credit")
    refund = activity_side(Refund, related_name="entry")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The staff user who made a deposit.",
    )
    memo = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "t_redpack_journal_entry"
        verbose_name_plural = "journal entries"
        constraints = [
            models.CheckConstraint(
                condition=Q(kind=EntryKind.CREDIT, grab__isnull=False)
                | Q(~Q(kind=EntryKind.CREDIT), grab__isnull=True),
                name="entry_credit_has_grab",
            ),
            models.CheckConstraint(
                condition=Q(kind=EntryKind.REFUND, refund__isnull=False)
                | Q(~Q(kind=EntryKind.REFUND), refund__isnull=True),
                name="entry_refund_has_refund",
            ),
        ]

    def __str__(self) -> str:
        return f"entry #{self.pk} {self.kind}"


class JournalLine(Immutable):
    """One account's share of an entry: positive in, negative out."""

    entry = models.ForeignKey(JournalEntry, on_delete=models.PROTECT, related_name="lines")
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="lines")
    amount = ledger_field()

    class Meta:
        db_table = "t_redpack_journal_line"
        indexes = [models.Index(fields=["account", "-id"], name="line_account_recent")]
        constraints = [
            models.CheckConstraint(condition=~Q(amount=0), name="line_amount_nonzero"),
        ]

    def __str__(self) -> str:
        return f"{self.amount} on account {self.account_id} (entry {self.entry_id})"
