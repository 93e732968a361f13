"""Data and constraints. Table names follow the seeds; money is DECIMAL(12, 2)."""

from decimal import Decimal

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
        indexes = [models.Index(fields=["activity", "status"], name="packet_activity_status")]
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
