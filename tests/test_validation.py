"""The one check of a send (redpack/validation.py), as the API and the admin apply it."""

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from redpack.errors import InvalidInput
from redpack.validation import activity_send_validate

pytestmark = pytest.mark.django_db

VALID = {
    "total_amount": Decimal("10.00"),
    "total_count": 5,
    "strategy": "pessimistic",
    "allocation_kind": "double_average",
    "expires_in": 600,
}

# One bad value per rule, and the field the refusal names.
BAD = [
    ({"strategy": "no_such_strategy"}, "strategy"),
    ({"allocation_kind": "triangle"}, "allocation"),
    ({"total_amount": Decimal("0.04")}, "total_amount"),  # fewer cents than packets
    ({"total_amount": Decimal("5000.00"), "total_count": 1}, "total_amount"),  # packet too big
    ({"total_count": 0}, "total_count"),
    ({"expires_in": 0}, "expires_in"),
]


def test_a_valid_send_gives_its_cents():
    assert activity_send_validate(**VALID) == 1000


@pytest.mark.parametrize(("change", "field"), BAD)
def test_each_rule_names_its_field(change, field):
    with pytest.raises(InvalidInput) as refused:
        activity_send_validate(**{**VALID, **change})
    assert refused.value.field == field


def test_the_api_and_the_admin_refuse_the_same_send_on_the_same_field(client, make_users):
    (user,) = make_users(1)
    get_user_model().objects.filter(pk=user.pk).update(is_staff=True, is_superuser=True)
    too_big = {"total_amount": "5000.00", "total_count": 1, "strategy": "pessimistic"}

    api = APIClient()
    api.force_authenticate(user)
    response = api.post("/api/activities/", {**too_big, "expires_in": 600}, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["total_amount"]

    client.force_login(get_user_model().objects.get(pk=user.pk))
    form = (
        client.post(
            "/admin/redpack/activity/add/",
            {**too_big, "allocation": "double_average", "expires_in": "600"},
        )
        .context["adminform"]
        .form
    )
    assert list(form.errors) == ["total_amount"]
