"""The one check of a send, for the API, the admin and the service alike.

`send_limits` gives the bounds and choices (from settings, read when asked, so overrides
apply) that the API serializer and the admin form show as field constraints;
`activity_send_validate` enforces every rule and names the field at fault (InvalidInput).
"""

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

from strategies import registry

from . import allocation
from .errors import InvalidInput
from .money import to_cents

DEFAULT_EXPIRES_IN = 86400  # seconds


@dataclass(frozen=True)
class SendLimits:
    strategies: list[str]  # the ones a send may name
    allocations: list[str]
    max_count: int
    min_expires_in: int
    max_expires_in: int


def send_limits() -> SendLimits:
    return SendLimits(
        strategies=[name for name in registry.names() if registry.allowed(name)],
        allocations=[kind.value for kind in allocation.Allocation],
        max_count=settings.REDPACK_MAX_COUNT,
        min_expires_in=settings.REDPACK_MIN_EXPIRES_IN,
        max_expires_in=settings.REDPACK_MAX_EXPIRES_IN,
    )


def activity_send_validate(
    *,
    total_amount: Decimal,
    total_count: int,
    strategy: str,
    allocation_kind: str,
    expires_in: int,
) -> int:
    """Check a send request against the rules; return the total in cents or raise InvalidInput."""
    if strategy not in registry.names():
        raise InvalidInput(f"unknown strategy {strategy!r}", field="strategy")
    if not registry.allowed(strategy):
        reason = registry.unavailable_reason(strategy)
        raise InvalidInput(f"strategy {strategy!r} is not available: {reason}", field="strategy")
    if allocation_kind not in {kind.value for kind in allocation.Allocation}:
        raise InvalidInput(f"unknown allocation {allocation_kind!r}", field="allocation")
    if not 1 <= total_count <= settings.REDPACK_MAX_COUNT:
        raise InvalidInput(
            f"total_count must be between 1 and {settings.REDPACK_MAX_COUNT}", field="total_count"
        )
    try:
        total_cents = to_cents(total_amount)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="total_amount") from exc
    if total_cents > to_cents(settings.REDPACK_MAX_TOTAL_AMOUNT):
        raise InvalidInput(
            f"total_amount exceeds the maximum of {settings.REDPACK_MAX_TOTAL_AMOUNT}",
            field="total_amount",
        )
    if total_cents > total_count * to_cents(settings.REDPACK_MAX_PACKET_AMOUNT):
        raise InvalidInput(
            f"the average packet may not exceed {settings.REDPACK_MAX_PACKET_AMOUNT}",
            field="total_amount",
        )
    try:
        allocation.validate(total_cents, total_count)
    except allocation.AllocationError as exc:
        raise InvalidInput(str(exc), field="total_amount") from exc
    if not settings.REDPACK_MIN_EXPIRES_IN <= expires_in <= settings.REDPACK_MAX_EXPIRES_IN:
        raise InvalidInput(
            f"expires_in must be between {settings.REDPACK_MIN_EXPIRES_IN} and "
            f"{settings.REDPACK_MAX_EXPIRES_IN} seconds",
            field="expires_in",
        )
    return total_cents
