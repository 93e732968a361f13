"""Schemathesis against the live OpenAPI schema a real gunicorn serves: no 5xx, and every
response conforms to the schema (status codes, content types, bodies)."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from rest_framework_simplejwt.tokens import AccessToken

from tests.servers import gunicorn


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
    case.call_and_validate(base_url=live_server_url, headers=auth_header)
