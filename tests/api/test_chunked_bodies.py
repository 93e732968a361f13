"""Bodies over a real socket to gunicorn. One without a Content-Length (Transfer-Encoding:
chunked), which Django would read as empty: 411 where a view reads a body, the connection kept
in step; the grab and the ping, which read none, answer as ever, once the body has come whole.
One that ends before its Content-Length or its last chunk, or whose chunks are malformed: 400,
never taken for a whole request."""

import http.client
import json
import socket

import pytest
from rest_framework_simplejwt.tokens import AccessToken

from redpack import selectors, services
from redpack.models import Activity, GrabDetail
from tests.servers import Answers, gunicorn, raw_request

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


def test_a_body_cut_short_of_its_content_length_is_400_and_moves_no_money(sender):
    """A client that closes its side before the body it declared has come (a send cut after its
    first fields): 400 naming Content-Length, nothing sent, the wallet as it was; the whole
    body on the same server is taken."""
    token = str(AccessToken.for_user(sender))
    before = selectors.wallet_balance(user_id=sender.pk)
    body = json.dumps({"total_amount": "1.00", "total_count": 1, "strategy": "pessimistic"})

    def send(declared: int, sent: str) -> tuple[int, dict]:
        head = (
            f"POST /api/activities/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n"
            "Connection: close\r\n\r\n"
        )
        status, _, answer = raw_request(base, (head + sent).encode(), end=True)
        return status, json.loads(answer)

    with gunicorn(workers=1, threads=4) as base:
        status, answer = send(len(body) + 100, body)
        assert status == 400, answer
        assert list(answer["error"]["fields"]) == ["Content-Length"]
        assert not Activity.objects.exists()
        assert selectors.wallet_balance(user_id=sender.pk) == before
        status, answer = send(len(body), body)
    assert status == 201, answer
    assert Activity.objects.count() == 1


GRAB_BODIES = [
    # (the framing headers and the body sent, the field the 400 names): the client then closes
    # its side, or (malformed) not
    (b"Content-Length: 10\r\n\r\nabc", True, "Content-Length"),
    (b"Transfer-Encoding: chunked\r\n\r\nzz\r\nGARBAGE\r\n", False, "body"),
    (b"Transfer-Encoding: chunked\r\n\r\n2;\nab\r\n0\r\n\r\n", False, "body"),
]


@pytest.mark.parametrize(("framed", "end", "field"), GRAB_BODIES)
def test_a_grab_whose_body_is_cut_short_or_malformed_is_400_and_grabs_nothing(
    sender, make_users, framed, end, field
):
    """The grab reads no body, and ran on a request whose body its client never finished (its
    Content-Length), or whose chunks were malformed (where a proxy may see another request in
    them): a 400 naming the framing, before the view; the same grab framed whole is taken."""
    (grabber,) = make_users(1)
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="3.00", total_count=3, strategy="redis_counter"
    )
    head = (
        f"POST /api/activities/{activity.pk}/grab/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {AccessToken.for_user(grabber)}\r\n"
    ).encode()
    with gunicorn(workers=1, threads=2) as base:
        status, headers, answer = raw_request(base, head + framed, end=end)
        assert status == 400, answer
        assert list(json.loads(answer)["error"]["fields"]) == [field]
        assert headers["connection"] == "close"
        whole, _, _ = raw_request(base, head + b"Content-Length: 2\r\n\r\n{}", end=True)
    assert whole == 200
    assert list(GrabDetail.objects.filter(activity=activity).values_list("user", flat=True)) == [
        grabber.pk
    ]


def _grab_head(activity: Activity, user) -> bytes:
    return (
        f"POST /api/activities/{activity.pk}/grab/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {AccessToken.for_user(user)}\r\n"
        "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
    ).encode()


def _continued(sock: socket.socket, head: bytes) -> Answers:
    """Send `head`, which asks for a 100 Continue, and read it: the server has the head alone."""
    sock.sendall(head)
    answers = Answers(sock)
    assert answers.readline() == b"HTTP/1.1 100 Continue\r\n"
    assert answers.readline() == b"\r\n"
    return answers


@pytest.mark.parametrize(
    ("body", "end"),
    [
        (b"zz\r\nGARBAGE\r\n0\r\n\r\n", False),  # a size that is none
        (b"2;\nab\r\n0\r\n\r\n", False),  # an extension with a bare LF
        (b"5\r\nhel", True),  # the client closes its side before the last chunk
    ],
)
def test_a_chunked_grab_whose_body_comes_after_its_head_waits_for_it(sender, make_users, body, end):
    """The loop waits for a chunked body as for one with a Content-Length (the grab read none,
    and ran as soon as the head came: with chunks malformed, or never finished, that came
    later): a 400 naming `body`, nothing grabbed."""
    (grabber,) = make_users(1)
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="3.00", total_count=3, strategy="redis_counter"
    )
    with gunicorn(workers=1, threads=2) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            answers = _continued(sock, _grab_head(activity, grabber))
            sock.sendall(body)
            if end:
                sock.shutdown(socket.SHUT_WR)
            status, headers, answer = answers.next()
    assert status == 400, answer
    assert list(json.loads(answer)["error"]["fields"]) == ["body"]
    assert headers["connection"] == "close"
    assert not GrabDetail.objects.filter(activity=activity).exists()


def test_a_chunked_grab_sent_in_pieces_is_grabbed_once_whole_and_its_connection_kept(
    sender, make_users
):
    (grabber,) = make_users(1)
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="3.00", total_count=3, strategy="redis_counter"
    )
    ping = b"GET /api/ping/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with gunicorn(workers=1, threads=2) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            answers = _continued(sock, _grab_head(activity, grabber))
            for piece in (b"5\r\nhe", b"llo\r\n0\r", b"\nX-Sum: 1\r\n", b"\r\n" + ping):
                sock.sendall(piece)
            status, headers, answer = answers.next()
            assert (status, json.loads(answer)["outcome"]) == (200, "grabbed")
            assert headers.get("connection") != "close"
            assert answers.until_closed() == [401]  # the ping after it, on the same connection
    assert GrabDetail.objects.filter(activity=activity, user=grabber).count() == 1


@pytest.mark.parametrize("target", [b"//api/ping/", b"//api/nothing", b"/metrics/"])
def test_a_path_near_the_apis_is_answered_in_json(target):
    """A doubled slash before the API's paths, a slash after the metrics' path."""
    with gunicorn(workers=1, threads=2) as base:
        status, headers, body = raw_request(
            base, b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
    assert status == 404 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "not_found"
