"""The reads of redpack/selectors.py, on the real database."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from redpack import selectors, services
from redpack.admin import ActivityAdmin
from redpack.errors import Forbidden, NotFound
from redpack.models import Activity

pytestmark = pytest.mark.django_db(transaction=True)


def test_grabbed_count_is_one_number_for_the_api_and_the_admin(sender, make_users):
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy="pessimistic"
    )
    for user in make_users(2):
        services.activity_grab(activity_id=activity.pk, user_id=user.pk)
    services.activity_expire(activity_id=activity.pk, force=True)  # 3 packets go back

    activity = selectors.activity_get(activity_id=activity.pk)
    client = APIClient()
    client.force_authenticate(sender)
    from_api = client.get(f"/api/activities/{activity.pk}/").json()["grabbed_count"]
    from_admin = ActivityAdmin(Activity, None).progress(activity)  # type: ignore[arg-type]
    assert selectors.activity_grabbed_count(activity) == from_api == 2
    assert from_admin.endswith("</progress> 2 / 5")


def test_state_is_what_people_call_it(sender, make_users):
    """Sold out wins over expired (its refund is 0); expired until the refund is written."""

    def send(count: int) -> Activity:
        return services.activity_send(
            sender_id=sender.pk,
            total_amount=f"{count}.00",
            total_count=count,
            strategy="pessimistic",
        )

    def state(activity: Activity) -> str:
        return selectors.activity_state(selectors.activity_get(activity_id=activity.pk))

    sold_out, expired, refunded = send(1), send(2), send(3)
    assert state(sold_out) == "open"
    services.activity_grab(activity_id=sold_out.pk, user_id=make_users(1)[0].pk)
    services.activity_expire(activity_id=sold_out.pk, force=True)
    assert state(sold_out) == "sold out"
    Activity.objects.filter(pk=expired.pk).update(expires_at=timezone.now())
    assert state(expired) == "expired"
    services.activity_expire(activity_id=refunded.pk, force=True)
    assert state(refunded) == "refunded"


def test_who_grabbed_what_is_for_the_sender_and_staff(sender, make_users):
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy="pessimistic"
    )
    stranger, staff = make_users(2)
    get_user_model().objects.filter(pk=staff.pk).update(is_staff=True)
    assert (
        list(
            selectors.activity_grabs(
                activity_id=activity.pk, viewer_id=sender.pk, viewer_is_staff=False
            )
        )
        == []
    )
    assert (
        list(
            selectors.activity_grabs(
                activity_id=activity.pk, viewer_id=staff.pk, viewer_is_staff=True
            )
        )
        == []
    )
    with pytest.raises(Forbidden):
        selectors.activity_grabs(
            activity_id=activity.pk, viewer_id=stranger.pk, viewer_is_staff=False
        )


@pytest.mark.parametrize("activity_id", [0, -1, 2**63, 10**6])
def test_an_activity_that_cannot_exist_is_not_found(activity_id):
    with pytest.raises(NotFound):
        selectors.activity_get(activity_id=activity_id)
