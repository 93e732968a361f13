"""A body without a Content-Length (Transfer-Encoding: chunked), which Django would read as
empty: 411 at once where a view reads a body, over a real socket to gunicorn, the connection
kept in step; the grab and the ping, which read none, answer as ever."""

import http.client
import json

import pytest
from rest_framework_simplejwt.tokens import AccessToken

from redpack import services
from redpack.models import Activity, GrabDetail
from tests.servers import gunicorn

pytestmark = pytest.mark.django_db(transaction=True)


def exchange(base: str, requests: list[tuple[str, str, bytes, str]]) -> list[tuple[int, dict]]:
    """Send each (method, path, body, token) in turn on one kept-alive connection, its body in
    chunks of 16 bytes without a Content-Length; the (status, JSON body) of each answer."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    found = []
    try:
        for method, path, body, token in requests:
            connection.request(
                method,
                path,
                body=iter([body[i : i + 16] for i in range(0, len(body), 16)]),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                encode_chunked=True,
            )
            response = connection.getresponse()
            found.append((response.status, json.loads(response.read())))
    finally:
        connection.close()
    return found


def test_a_chunked_body_is_411_where_a_body_is_read_and_the_connection_stays_in_step(
    sender, make_users
):
    (grabber,) = make_users(1)
    token, grab_token = (str(AccessToken.for_user(user)) for user in (sender, grabber))
    send = {"total_amount": "3.00", "total_count": 3, "strategy": "pessimistic", "expires_in": 60}
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="3.00", total_count=3, strategy="pessimistic"
    )
    with gunicorn(workers=1, threads=4) as base:
        # On one kept-alive connection: the send's chunked body is skipped, not read as the
        # next request; the grab and the ping read no body and answer as they would without.
        got = exchange(
            base,
            [
                ("POST", "/api/activities/", json.dumps(send).encode(), token),
                ("POST", f"/api/activities/{activity.pk}/grab/", b"{}", grab_token),
                ("GET", "/api/ping/", b"x" * 100, grab_token),
            ],
        )
    assert [status for status, _ in got] == [411, 200, 200], got
    assert list(got[0][1]["error"]["fields"]) == ["Content-Length"]
    assert got[1][1]["outcome"] == "grabbed" and got[2][1] == {"pong": True}
    assert Activity.objects.count() == 1
    assert GrabDetail.objects.filter(activity=activity, user=grabber).count() == 1
