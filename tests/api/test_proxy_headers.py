"""What a client's proxy headers may change, over a real socket to gunicorn with the server's
own config (gunicorn.conf.py): the scheme only from X-Forwarded-Proto, and only with HTTPS=1
(settings.SECURE_PROXY_SSL_HEADER); gunicorn trusted three such headers from any client on its
host, and the app's links said https:// on a plain server."""

import json

import pytest
from rest_framework_simplejwt.tokens import AccessToken

from redpack import services
from tests.servers import gunicorn, raw_request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "forwarded",
    [
        b"X-Forwarded-Ssl: on\r\n",
        b"X-Forwarded-Protocol: ssl\r\n",
        b"X-Forwarded-Proto: https\r\n",
        b"X-Forwarded-Proto: https\r\nX-Forwarded-Ssl: off\r\n",  # gunicorn said 400: contradictory
    ],
)
def test_a_plain_server_links_over_http_whatever_the_client_says(sender, forwarded):
    services.activity_send(
        sender_id=sender.pk, total_amount="1.00", total_count=1, strategy="redis_counter"
    )
    request = (
        b"GET /api/me/wallet/?limit=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Authorization: Bearer %s\r\n"
        % str(AccessToken.for_user(sender)).encode()
        + forwarded
        + b"\r\n"
    )
    with gunicorn(workers=1, threads=2) as base:
        status, _, body = raw_request(base, request)
    assert status == 200, body
    assert json.loads(body)["next"].startswith("http://127.0.0.1/api/me/wallet/?")
