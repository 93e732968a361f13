"""Schemathesis against the live OpenAPI schema a real gunicorn serves: no 5xx, and every
response conforms to the schema (status codes, content types, bodies)."""

import re
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from rest_framework_simplejwt.tokens import AccessToken
from schemathesis.specs.openapi.checks import positive_data_acceptance

from redpack.allocation import Allocation
from redpack.errors import InvalidInput
from redpack.validation import DEFAULT_EXPIRES_IN, activity_send_validate
from tests.servers import gunicorn

SEND = "POST /api/activities/"


@pytest.fixture(scope="module")
def live_server_url(django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    with gunicorn(workers=1, threads=4) as base:
        yield base


@pytest.fixture
def api_schema(live_server_url, transactional_db):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_url(f"{live_server_url}/api/schema/?format=json")


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture
def auth_header(sender) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"Authorization": f"Bearer {AccessToken.for_user(sender)}"}


@schema.parametrize()
@settings(max_examples=30, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_and_never_fails(case, auth_header, live_server_url):  # type: ignore[no-untyped-def]
    response = case.call(base_url=live_server_url, headers=auth_header)
    repeated = response.status_code == 400 and sent_a_field_twice(response.request)
    if repeated:
        # Two of the extra properties the schema allows, encoded to one form field name by the
        # client: the request as sent gives that field twice, which the server refuses (400,
        # parse_error, api/parsers.py) rather than keep one of the values.
        assert response.json()["error"]["code"] == "parse_error", response.text
    refusable = case.operation.label == SEND or repeated
    case.validate_response(  # as call_and_validate does, the exclusion known from the answer
        response,
        headers=auth_header,
        excluded_checks=[positive_data_acceptance] if refusable else None,
        transport_kwargs={"base_url": live_server_url, "headers": dict(auth_header)},
    )
    if case.operation.label != SEND or repeated:
        return
    # A send that the schema allows may still be refused (400, naming total_amount) by what
    # OpenAPI cannot state: the total's rules (its maximum, and those across the fields) and
    # the sender's wallet. Only by them.
    if case.meta.generation.mode.is_positive and response.status_code == 400:
        error = response.json()["error"]
        assert list(error["fields"]) == ["total_amount"], error
        assert error["code"] == "insufficient_balance" or total_refused_by_the_rules(case.body)


def sent_a_field_twice(request: requests.PreparedRequest) -> bool:
    """Whether a form body, as sent, gives one field name twice (as the server reads the names:
    a multipart part's name byte for byte, a urlencoded name decoded as UTF-8)."""
    body = request.body or b""
    raw = body if isinstance(body, bytes) else body.encode()
    content_type = request.headers.get("Content-Type", "")
    if content_type.startswith("multipart/form-data"):
        names = re.findall(rb'Content-Disposition: form-data; name="((?:[^"\\]|\\.)*)"', raw)
    elif content_type.startswith("application/x-www-form-urlencoded"):
        text = raw.decode("ascii", "replace")
        names = [name.encode() for name, _ in parse_qsl(text, keep_blank_values=True)]
    else:
        return False
    return len(names) != len(set(names))


def total_refused_by_the_rules(body: dict[str, Any]) -> bool:
    """Whether the send's own rules (validation.activity_send_validate, as the service applies
    them) refuse this body's total: its maximum, a cent per packet at least, the largest packet
    on average at most. A multipart body's values are text."""
    try:
        activity_send_validate(
            total_amount=Decimal(str(body["total_amount"])),
            total_count=int(body["total_count"]),
            strategy=str(body["strategy"]),
            allocation_kind=str(body.get("allocation", Allocation.DOUBLE_AVERAGE.value)),
            expires_in=int(body.get("expires_in", DEFAULT_EXPIRES_IN)),
        )
    except InvalidInput as refused:
        return refused.field == "total_amount"
    return False


def test_the_first_schema_requests_to_a_new_server_all_get_it() -> None:
    """A new worker's first generations, many at once (the docs page of each browser that opens
    it asks for the schema): drf-spectacular loads its extensions' classes during the first and
    not safely from many threads at once (up to 61 of 64 got a 500)."""
    with gunicorn(workers=1, threads=32) as base, ThreadPoolExecutor(32) as pool:
        statuses = list(
            pool.map(
                lambda _: requests.get(f"{base}/api/schema/", timeout=120).status_code,
                range(32),
            )
        )
    assert statuses == [200] * 32
