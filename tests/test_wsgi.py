"""redpack/wsgi.py: a chunked request body (no Content-Length) reaches the views, measured
against the body limit like any other, over a real socket to gunicorn."""

import http.client
import json
from collections.abc import Iterator

import pytest
from rest_framework_simplejwt.tokens import AccessToken

from redpack.models import Activity
from tests.servers import gunicorn, raw_request

pytestmark = pytest.mark.django_db(transaction=True)

SEND = {
    "total_amount": "3.00",
    "total_count": 3,
    "strategy": "pessimistic",
    "allocation": "equal",
    "expires_in": 600,
}


def chunked_post(base: str, path: str, parts: Iterator[bytes], token: str) -> tuple[int, dict]:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(
            "POST",
            path,
            body=parts,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
            encode_chunked=True,
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_chunked_body_is_read_and_measured_like_any_other(sender):
    body = json.dumps(SEND).encode()
    token = str(AccessToken.for_user(sender))
    with gunicorn(workers=1, threads=4) as base:
        status, created = chunked_post(
            base, "/api/activities/", iter([body[:7], body[7:20], body[20:]]), token
        )
        assert status == 201, created
        assert Activity.objects.get(pk=created["id"]).total_count == 3

        padded = json.dumps({**SEND, "pad": "x" * 70_000}).encode()
        status, refused = chunked_post(
            base,
            "/api/activities/",
            iter([padded[i : i + 4096] for i in range(0, len(padded), 4096)]),
            token,
        )
        assert status == 413 and refused["error"]["code"] == "too_large", refused

        status, headers, answer = raw_request(
            base,
            b"POST /api/activities/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"zz\r\n{}\r\n0\r\n\r\n",
        )
        assert (status, headers["content-type"]) == (400, "application/json")
        assert list(json.loads(answer)["error"]["fields"]) == ["Transfer-Encoding"]
    assert Activity.objects.count() == 1
