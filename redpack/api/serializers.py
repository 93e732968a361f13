from decimal import Decimal
from typing import Any

from django.http import QueryDict
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from redpack.allocation import Allocation
from redpack.api.errors import ECHOED
from redpack.models import Activity, EntryKind, GrabDetail, JournalLine, Refund
from redpack.money import AMOUNT_FORMAT, AMOUNT_TEXT
from redpack.selectors import activity_grabbed_count
from redpack.validation import DEFAULT_EXPIRES_IN, send_limits
from strategies import registry
from strategies.base import Outcome

# What the schema publishes: the strings of money.AMOUNT_TEXT worth at least 0.01, without leading
# zeros (a pattern cannot say "minimum", and a client reading the schema must not be led to
# send "0").
MONEY_SCHEMA_PATTERN = r"^([1-9][0-9]{0,9}(\.[0-9]{1,2})?|0\.(0[1-9]|[1-9][0-9]?))$"


@extend_schema_field({"type": "string", "pattern": MONEY_SCHEMA_PATTERN, "example": "100.00"})
class MoneyField(serializers.Field):
    """An amount as a decimal string of ASCII digits with at most two decimals; never a float."""

    default_error_messages = {
        "invalid": AMOUNT_FORMAT,
        "min_value": "Must be at least 0.01.",
    }

    def to_internal_value(self, data: object) -> Decimal:
        if not isinstance(data, str) or not AMOUNT_TEXT.fullmatch(data):
            self.fail("invalid")
        amount = Decimal(data)
        if amount < Decimal("0.01"):
            self.fail("min_value")
        return amount

    def to_representation(self, value: Decimal) -> str:
        return str(value)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer, or in a form's body (whose values are all strings) a string of ASCII
    digits; never a float, a bool, or a string in JSON."""

    def to_internal_value(self, data: Any) -> int:
        from_form = isinstance(getattr(self.root, "initial_data", None), QueryDict)
        ascii_digits = (
            from_form and isinstance(data, str) and data.isascii() and data.lstrip("-").isdigit()
        )
        if isinstance(data, bool) or not (isinstance(data, int) or ascii_digits):
            self.fail("invalid")
        return super().to_internal_value(data)


class ChoiceField(serializers.ChoiceField):
    """DRF's, its refusal quoting at most ECHOED characters of what was sent (DRF's quoted all of
    it: a 60 KB value gave a 60 KB answer)."""

    def to_internal_value(self, data: Any) -> Any:
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError:
            self.fail("invalid_choice", input=str(data)[:ECHOED])


class StrategyField(ChoiceField):
    """The strategies a send may name; one configured but not available here is refused with
    the reason (registry.unavailable_reason) rather than "not a valid choice"."""

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, str) and data not in self.choices and data in registry.names():
            raise serializers.ValidationError(
                f"{data!r} is not available here: {registry.unavailable_reason(data)}",
                code="unavailable",
            )
        return super().to_internal_value(data)  # type: ignore[no-any-return]


class ActivityCreateSerializer(serializers.Serializer):
    """The shape of a send; its rules are validation.activity_send_validate's, which the
    service applies (and whose bounds the fields show)."""

    total_amount = MoneyField(help_text="Decimal string, at most two decimals, at least 0.01.")

    def get_fields(self) -> dict[str, serializers.Field]:
        """Bounds and choices come from settings at request time, so they follow overrides."""
        fields = super().get_fields()
        limits = send_limits()
        fields["total_count"] = StrictIntegerField(min_value=1, max_value=limits.max_count)
        fields["strategy"] = StrategyField(choices=limits.strategies)
        fields["allocation"] = ChoiceField(
            choices=limits.allocations, default=Allocation.DOUBLE_AVERAGE.value
        )
        fields["expires_in"] = StrictIntegerField(
            default=DEFAULT_EXPIRES_IN,
            min_value=limits.min_expires_in,
            max_value=limits.max_expires_in,
            help_text="Seconds until expiry.",
        )
        return fields


class ActivitySerializer(serializers.ModelSerializer):
    remaining_amount = serializers.DecimalField(
        source="surplus_amount", max_digits=12, decimal_places=2
    )
    remaining_count = serializers.IntegerField(source="surplus_count")
    grabbed_count = serializers.SerializerMethodField()
    # A decimal string, as every amount is (a method field's Decimal went out as a JSON float);
    # null until the refund.
    refunded_amount = serializers.DecimalField(
        source="refund.amount", max_digits=12, decimal_places=2, allow_null=True
    )

    class Meta:
        model = Activity
        fields = [
            "id",
            "sender",
            "total_amount",
            "total_count",
            "remaining_amount",
            "remaining_count",
            "grabbed_count",
            "refunded_amount",
            "strategy",
            "allocation",
            "status",
            "created_at",
            "expires_at",
        ]
        read_only_fields = fields

    def get_grabbed_count(self, activity: Activity) -> int:
        return activity_grabbed_count(activity)


class GrabResultSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=[o.value for o in Outcome])
    amount = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        allow_null=True,
        required=False,
        help_text="Set for grabbed and already_grabbed.",
    )
    reason = serializers.ChoiceField(
        choices=["shed"],
        required=False,
        help_text="contended only: `shed` when the server turned the grab away at once "
        "(its line for the activity was full); retry after Retry-After seconds.",
    )


class GrabDetailSerializer(serializers.ModelSerializer):
    activity = serializers.IntegerField(source="activity_id")

    class Meta:
        model = GrabDetail
        fields = ["activity", "amount", "created_at"]
        read_only_fields = fields


class ActivityGrabSerializer(serializers.ModelSerializer):
    user = serializers.IntegerField(source="user_id")
    username = serializers.CharField(source="user.username")

    class Meta:
        model = GrabDetail
        fields = ["user", "username", "amount", "created_at"]
        read_only_fields = fields


class RefundSerializer(serializers.ModelSerializer):
    activity = serializers.IntegerField(source="activity_id")

    class Meta:
        model = Refund
        fields = ["activity", "amount", "count", "created_at"]
        read_only_fields = fields


class WalletLineSerializer(serializers.ModelSerializer):
    """One movement of your wallet: positive in, negative out."""

    entry = serializers.IntegerField(source="entry_id")
    kind = serializers.ChoiceField(
        source="entry.kind",
        choices=EntryKind.choices,
        help_text="deposit, send (to an activity you sent), credit (a grab of yours), refund "
        "(what was left of an activity you sent).",
    )
    activity = serializers.IntegerField(source="entry.activity_id", allow_null=True)
    created_at = serializers.DateTimeField(source="entry.created_at")

    class Meta:
        model = JournalLine
        fields = ["entry", "kind", "activity", "amount", "created_at"]
        read_only_fields = fields


class StrategySerializer(serializers.Serializer):
    name = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]
    tradeoff = serializers.CharField()
    safe = serializers.BooleanField()
    allowed = serializers.BooleanField()
    unavailable_reason = serializers.CharField(
        allow_null=True, help_text="Why it may not be chosen here (null when allowed)."
    )


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField())
    )


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()
