"""Fixtures of the strategies' fault tests."""

from collections.abc import Iterator

import pytest
from django.db import connection

from tests.faults import FaultProxy, mysql_reply_done


@pytest.fixture
def mysql_proxy() -> Iterator[FaultProxy]:
    """This thread's MySQL connection through the proxy."""
    params = connection.settings_dict
    proxy = FaultProxy(
        (params["HOST"] or "127.0.0.1", int(params["PORT"] or 3306)), reply_done=mysql_reply_done
    )
    saved = (params["HOST"], params["PORT"])
    connection.close()
    params["HOST"], params["PORT"] = "127.0.0.1", str(proxy.port)
    yield proxy
    connection.close()
    params["HOST"], params["PORT"] = saved
    proxy.cut()
