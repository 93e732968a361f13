"""Schemathesis against the live OpenAPI schema a real gunicorn serves: no 5xx, and every
response conforms to the schema (status codes, content types, bodies)."""

from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

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
@settings(max_examples=30, suppress_health_check=list(HealthCheck))
def test_api_conforms_and_never_fails(case, auth_header, live_server_url):  # type: ignore[no-untyped-def]
    if case.operation.label != SEND:
        case.call_and_validate(base_url=live_server_url, headers=auth_header)
        return
    # A send that the schema allows may still be refused (400, naming total_amount) by what
    # OpenAPI cannot state: the total's rules (its maximum, and those across the fields) and
    # the sender's wallet. Only by them.
    response = case.call_and_validate(
        base_url=live_server_url, headers=auth_header, excluded_checks=[positive_data_acceptance]
    )
    if case.meta.generation.mode.is_positive and response.status_code == 400:
        error = response.json()["error"]
        assert list(error["fields"]) == ["total_amount"], error
        assert error["code"] == "insufficient_balance" or total_refused_by_the_rules(case.body)


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
