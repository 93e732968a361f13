"""A strategy that is not exact on this database is listed as unavailable, with the reason."""

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import AccessToken

from redpack.models import Activity, GrabDetail
from strategies import registry
from tests.dummy_strategies import DUMMIES

pytestmark = pytest.mark.django_db

REASON = "needs oracle; this server runs on mysql"


@pytest.fixture
def dummies():  # type: ignore[no-untyped-def]
    with override_settings(REDPACK_STRATEGIES={**settings.REDPACK_STRATEGIES, **DUMMIES}):
        yield


def test_registry_says_why(dummies):  # type: ignore[no-untyped-def]
    assert registry.unavailable_reason("other_database") == REASON
    assert not registry.allowed("other_database")
    assert registry.unavailable_reason("pessimistic") is None and registry.allowed("pessimistic")


def test_api_lists_it_unavailable_and_refuses_it(dummies, sender):  # type: ignore[no-untyped-def]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(sender)}")
    rows = {row["name"]: row for row in client.get("/api/strategies/").json()}
    assert (rows["other_database"]["allowed"], rows["other_database"]["unavailable_reason"]) == (
        False,
        REASON,
    )
    assert rows["pessimistic"]["unavailable_reason"] is None
    body = {"total_amount": "1.00", "total_count": 1, "strategy": "other_database"}
    response = client.post("/api/activities/", body, format="json")
    assert response.status_code == 400
    assert "strategy" in response.json()["error"]["fields"]


def test_seed_demo_is_idempotent_and_skips_unavailable(dummies, capsys):  # type: ignore[no-untyped-def]
    with override_settings(
        REDPACK_STRATEGIES={
            n: settings.REDPACK_STRATEGIES[n] for n in ("pessimistic", "other_database")
        }
    ):
        call_command("seed_demo", "--grabs", "3")
        call_command("seed_demo", "--grabs", "3")
    out = capsys.readouterr().out
    assert f"other_database: skipped ({REASON})" in out
    assert "pessimistic: demo activity" in out and " kept" in out
    activity = Activity.objects.get(sender__username="demo")
    assert activity.strategy == "pessimistic"
    assert activity.surplus_count == activity.total_count - 3
    assert GrabDetail.objects.filter(activity=activity).count() == 3
