"""Money is integer cents in code and in Redis, DECIMAL(…, 2) in MySQL, decimal strings in JSON."""

import re
from decimal import Decimal, InvalidOperation

from django.db.models import DecimalField, F, Sum, Value
from django.db.models.functions import Coalesce, Round

CENT = Decimal("0.01")

# An amount as a client writes it (the API's bodies, the admin's deposit form): ASCII digits, at
# most 10 before the point and 2 after it; no sign, exponent, blank or other script's digits.
AMOUNT_TEXT = re.compile(r"[0-9]{1,10}(\.[0-9]{1,2})?")
AMOUNT_FORMAT = (
    "Send the amount as a decimal string of at most 10 digits before the point and 2 after it,"
    ' e.g. "12.34".'
)


def to_cents(amount: Decimal | str | int) -> int:
    """Exact conversion; raises ValueError for sub-cent, non-finite or non-numeric amounts."""
    try:
        value = Decimal(amount) * 100
    except (InvalidOperation, TypeError) as exc:
        raise ValueError(f"not an amount: {amount!r}") from exc
    if not value.is_finite() or value != value.to_integral_value():
        raise ValueError(f"not a whole number of cents: {amount!r}")
    return int(value)


def from_cents(cents: int) -> Decimal:
    return (Decimal(cents) / 100).quantize(CENT)


def sql_decimal(cents: int) -> str:
    """`cents` as an exact SQL DECIMAL literal ("-12.05"), built from the integer alone, so a
    statement may carry it inline (no escaping: the hot path's multi-row statements)."""
    if not isinstance(cents, int):
        raise TypeError(f"cents must be an int, not {type(cents).__name__}")
    whole, part = divmod(abs(cents), 100)
    return f"{'-' if cents < 0 else ''}{whole}.{part:02d}"


def minus(field: str, cents: int) -> Round:
    """`field - cents` in SQL on a DECIMAL(…, 2) column, rounded to the cent.

    The rounding changes nothing on MySQL, where DECIMAL arithmetic is exact. SQLite (the
    embedded fallback of `make run`) does it in floating point, and unrounded the stored value
    drifts: 0.30 - 0.10 - 0.10 - 0.10 is -2.8e-17 there, which breaks the CHECK constraints.
    """
    return Round(F(field) - from_cents(cents), 2)


def total(field: str) -> Round:
    """SUM(field) of DECIMAL(…, 2) values, 0 when there are none, rounded to the cent: a no-op
    on MySQL; SQLite sums in floating point (a million balances drift by 1e-10)."""
    zero = Value(Decimal("0.00"), output_field=DecimalField(max_digits=18, decimal_places=2))
    return Round(Coalesce(Sum(field), zero), 2)
