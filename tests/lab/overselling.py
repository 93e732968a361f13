"""A test double of a broken strategy: gives every grab a cent and never checks what is left.

It lets the bench's failure path run for real (on MariaDB): the auditor catches the oversell.
"""

from decimal import Decimal

from redpack.models import Activity, GrabDetail
from strategies.base import CloseResult, GrabResult, GrabStrategy, Outcome


class OversellingStrategy(GrabStrategy):
    name = "overselling"
    label = "test double: oversells"
    tradeoff = "Never checks the surplus; exists to make the auditor fail."
    safe = False

    def prepare(self, activity: Activity) -> None:
        """Nothing to prepare."""

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        GrabDetail.objects.create(activity_id=activity_id, user_id=user_id, amount=Decimal("0.01"))
        return GrabResult(Outcome.GRABBED, 1)

    def close(self, *, activity_id: int) -> CloseResult:
        raise NotImplementedError
