"""The concurrency contract every safe strategy must pass, on real MariaDB and Redis."""

import pytest

from .harness import check_close_stops_grabs, check_double_clicks


@pytest.mark.django_db(transaction=True)
def test_concurrent_double_clicks_never_oversell_or_duplicate(safe_strategy, make_users, sender):
    check_double_clicks(safe_strategy, make_users, sender)


@pytest.mark.django_db(transaction=True)
def test_grabs_after_close_answer_closed(safe_strategy, make_users, sender):
    check_close_stops_grabs(safe_strategy, make_users, sender)
