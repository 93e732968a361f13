"""The amount's published pattern (what the OpenAPI schema tells clients) admits only amounts
the API accepts: a client that follows the schema is never refused for the amount's form."""

import re
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redpack.api.serializers import MONEY_SCHEMA_PATTERN, MoneyField


@settings(max_examples=300)
@given(st.from_regex(MONEY_SCHEMA_PATTERN, fullmatch=True))
def test_every_published_amount_is_accepted(text: str) -> None:
    assert MoneyField().to_internal_value(text) >= Decimal("0.01")


@pytest.mark.parametrize("text", ["0", "0.0", "0.00", "00.01", "-1", ".5", "1.234", "1e3"])
def test_zero_and_other_refused_forms_are_not_published(text: str) -> None:
    assert re.fullmatch(MONEY_SCHEMA_PATTERN, text) is None


@pytest.mark.parametrize("text", ["0.01", "0.1", "0.99", "1", "100.00", "9999999999.99"])
def test_the_smallest_and_largest_forms_are_published(text: str) -> None:
    assert re.fullmatch(MONEY_SCHEMA_PATTERN, text) is not None
