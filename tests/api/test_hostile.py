"""Bad input and bad actors: clear 4xx, never a 500, never a change in the data."""

import json
import logging
import os
import random
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpRequest
from django_redis import get_redis_connection
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import AccessToken, RefreshToken

from redpack import bans, logs, services
from redpack.models import Activity, GrabDetail, Packet, Refund
from strategies import registry
from tests.servers import ROOT

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
    return client


def table_counts() -> tuple[int, ...]:
    return tuple(
        m.objects.count() for m in (Activity, GrabDetail, Packet, Refund, get_user_model())
    )


JUNK_VALUES = [
    None,
    True,
    [],
    {},
    [1, 2],
    {"a": 1},
    "",
    " ",
    "１００",
    "1e400",
    "-0.01",
    "0.001",
    "NaN",
    "Infinity",
    "-Infinity",
    "9" * 40,
    10**40,
    -(10**40),
    1.5,
    "1,00",
    "💰",
    "\x00",
    "'; DROP TABLE",
    "<script>",
    2**63,
    -1,
    0,
    "DROP",
    "double_average\x00",
    "pessimistic ",
    "PESSIMISTIC",
]
REQUIRED = {"total_amount", "total_count", "strategy"}
FIELDS = ["total_amount", "total_count", "strategy", "allocation", "expires_in"]
VALID = {
    "total_amount": "10.00",
    "total_count": 10,
    "strategy": "pessimistic",
    "allocation": "double_average",
    "expires_in": 600,
}


def malformed_bodies(n: int, rng: random.Random) -> list[bytes]:
    bodies: list[bytes] = []
    while len(bodies) < n:
        kind = rng.random()
        if kind < 0.15:
            bodies.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))))
        elif kind < 0.25:
            bodies.append(
                rng.choice(
                    [
                        b"[]",
                        b"null",
                        b"42",
                        b'"x"',
                        b"{",
                        b'{"total_amount":}',
                        b"{'a': 1}",
                        json.dumps([VALID]).encode(),
                    ]
                )
            )
        else:
            body = dict(VALID)
            for field in rng.sample(FIELDS, rng.randint(1, 3)):
                if field in REQUIRED and rng.random() < 0.2:
                    body.pop(field)
                else:
                    body[field] = rng.choice(JUNK_VALUES)
            bodies.append(json.dumps(body).encode())
    return bodies


def test_a_thousand_malformed_requests_change_nothing(sender, make_users):
    grabber = make_users(1)[0]
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy="pessimistic"
    )
    before = table_counts()
    rng = random.Random(20261121)
    client = client_for(grabber)
    statuses = []
    for body in malformed_bodies(800, rng):
        response = client.post("/api/activities/", body, content_type="application/json")
        statuses.append(response.status_code)
        assert response.status_code == 400, (body, response.content)
        assert "error" in response.json()
    hostile_paths = [
        f"/api/activities/{v}/grab/"
        for v in [
            "0",
            "-1",
            "abc",
            "1.5",
            "9" * 30,
            "%00",
            "null",
            "💰",
            str(2**63),
            str(activity.pk) + "0000",
        ]
    ]
    for _ in range(200):
        path = rng.choice(hostile_paths)
        response = client.post(
            path, rng.choice([b"", b"{}", b"[1]", b"\xff\xfe"]), content_type="application/json"
        )
        statuses.append(response.status_code)
        assert response.status_code == 404, (path, response.content)
    assert len(statuses) == 1000
    assert table_counts() == before
    activity.refresh_from_db()
    assert activity.surplus_count == 5


def test_unicode_and_boundary_amounts(sender):
    client = client_for(sender)
    for field, value in [
        ("total_amount", "１００"),
        ("total_amount", 1.5),
        ("total_amount", 100),
        ("total_count", "１０"),
        ("total_count", 10.0),
        ("total_count", True),
        ("expires_in", "６００"),
    ]:
        response = client.post("/api/activities/", {**VALID, field: value}, format="json")
        assert response.status_code == 400, (field, value)
        assert field in response.json()["error"]["fields"]
    ok = client.post(
        "/api/activities/", {**VALID, "total_amount": "0.10", "total_count": 10}, format="json"
    )
    assert ok.status_code == 201 and ok.json()["remaining_amount"] == "0.10"
    too_big = client.post(
        "/api/activities/", {**VALID, "total_amount": "2000.01", "total_count": 10}, format="json"
    )
    assert too_big.status_code == 400 and "total_amount" in too_big.json()["error"]["fields"]
    at_limit = client.post(
        "/api/activities/", {**VALID, "total_amount": "2000.00", "total_count": 10}, format="json"
    )
    assert at_limit.status_code == 201


def test_oversized_body_is_413(sender):
    response = client_for(sender).post(
        "/api/activities/",
        json.dumps({**VALID, "pad": "x" * 100_000}),
        content_type="application/json",
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert list(response.json()["error"]["fields"]) == ["Content-Length"]
    assert not Activity.objects.exists()


@pytest.mark.parametrize("formatter", [logs.JsonFormatter(), logs.PlainFormatter()])
def test_a_refusals_log_line_quotes_at_most_a_bounded_part_of_the_clients_input(caplog, formatter):
    """A scanner's 8 KB path or Host made every line it caused that long (a refused Host's
    twice: `Invalid HTTP_HOST header: '...'. You may need to add '...'`). The record keeps its
    request, for the handlers that read it (Django's AdminEmailHandler)."""
    caplog.set_level(logging.INFO)
    client = APIClient(raise_request_exception=False, enforce_csrf_checks=True)
    assert client.get("/nowhere/" + "a" * 6000).status_code == 404
    assert client.get("/api/ping/", HTTP_HOST="h" * 6000 + ".example").status_code == 400
    assert client.post("/admin/" + "a" * 6000).status_code == 403  # no CSRF cookie
    refusals = [r for r in caplog.records if r.name.startswith(("django.request", "django.sec"))]
    assert {r.name for r in refusals} >= {
        "django.request",
        "django.security.DisallowedHost",
        "django.security.csrf",
    }
    for record in refusals:
        assert len(record.getMessage()) > 6000  # as Django said it
        assert isinstance(getattr(record, "request", None), HttpRequest)
        assert len(formatter.format(record)) < 800, record.name


def test_an_admin_lookup_it_does_not_allow_is_a_400_logged_as_one_line(admin_client, caplog):
    """Django logs each at ERROR with a traceback (django.security.DisallowedModelAdmin*)."""
    caplog.set_level(logging.INFO)
    for path in (
        "/admin/redpack/activity/?_to_field=password",
        "/admin/auth/user/?_to_field=password",
        "/admin/auth/user/?password__startswith=x",
    ):
        assert admin_client.get(path).status_code == 400, path
    refused = [r for r in caplog.records if r.name.startswith("django.security.")]
    assert refused and all(r.levelno == logging.WARNING and not r.exc_info for r in refused)
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("[" * 5000 + "]" * 5000, "body"),  # deeper than Python parses: RecursionError
        ('{"a":' * 3000 + "1" + "}" * 3000, "body"),
        ('{"total_amount": "1.00", "total_amount": "2.00", "total_count": 1}', "total_amount"),
        ('{"total_amount": "1.00", "total_count": 1, "strategy": "\\ud800"}', "strategy"),
        ('{"allocation": ["\\udfff"], "total_count": 1}', "allocation"),
        ('{"\\ud800": 1}', "body"),
        ('"\\ud83d"', "body"),
        ('{"\\ud800": 1, "\\ud800": 2}', "body"),  # a key that cannot be echoed is not named
        ('{"total_count": 1, "allocation": {"a": 1, "a": 2}}', "allocation"),
        ('[{"a": 1, "a": 2}]', "body"),
    ],
)
def test_a_json_body_that_cannot_be_taken_whole_is_a_400_naming_where(sender, body, field):
    response = client_for(sender).post("/api/activities/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "parse_error"
    assert list(error["fields"]) == [field], error
    assert not Activity.objects.exists()


def test_a_json_integer_longer_than_python_reads_is_a_400_saying_so(sender):
    body = '{"total_amount": "1.00", "total_count": ' + "9" * 5000 + ', "strategy": "pessimistic"}'
    response = client_for(sender).post("/api/activities/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], list(error["fields"])) == ("parse_error", ["body"])
    assert "a number of 5000 digits" in error["message"]
    assert "sys." not in error["message"]  # not Python's advice to the server


@pytest.mark.parametrize("charset", ["utf-7", "cp037", "utf-16", "latin-1"])
def test_json_in_another_charset_than_utf8_is_a_400(sender, charset):
    """RFC 8259: JSON between systems is UTF-8. Decoded as the client declares, one username
    could reach the token view in many spellings the login throttle reads as different."""
    body = json.dumps(VALID).encode(charset)
    response = client_for(sender).post(
        "/api/activities/", body, content_type=f"application/json; charset={charset}"
    )
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["body"]
    assert not Activity.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        "[" * 5000 + "]" * 5000,
        '{"username": "\\ud800", "password": "x"}',
        '{"username": "a", "username": "b", "password": "x"}',
    ],
)
@pytest.mark.parametrize("path", ["/api/token/", "/api/token/refresh/"])
def test_a_login_body_that_cannot_be_taken_is_a_400_and_still_counted(path, body, settings):
    settings.REDPACK_LOGIN_RATES = {"ip": "3/min", "username": None}
    client = APIClient(raise_request_exception=False)
    codes = [client.post(path, body, content_type="application/json").status_code for _ in range(4)]
    assert codes == [400, 400, 400, 429]


@pytest.mark.parametrize("value", ["²", "５", "٣", "1.0", "-1", " 1", "0x10"])
@pytest.mark.parametrize("name", ["limit", "offset"])
def test_paging_takes_ascii_digits_only(sender, name, value):
    response = client_for(sender).get("/api/me/grabs/", {name: value})
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == [name]


def test_what_django_refuses_before_a_view_is_answered_in_json_naming_it(sender, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 3
    client = client_for(sender)
    host = client.get("/api/me/grabs/", HTTP_HOST="evil.example")
    assert host.status_code == 400
    assert list(host.json()["error"]["fields"]) == ["Host"]
    for form in ["multipart", None]:
        body = {f"field{i}": "1" for i in range(10)}
        many = (
            client.post("/api/activities/", body, format=form)
            if form
            else client.post(
                "/api/activities/",
                "&".join(f"{k}={v}" for k, v in body.items()),
                content_type="application/x-www-form-urlencoded",
            )
        )
        assert many.status_code == 400, many.content
        assert list(many.json()["error"]["fields"]) == ["body"], many.json()
    assert not Activity.objects.exists()


def test_too_many_fields_in_the_query_name_the_query_and_log_one_warning_line(
    sender, settings, caplog
):
    """Django applies its field limit to the query too and logs the refusal at ERROR with a
    traceback; the 400 named the body, wherever the fields were."""
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 3
    caplog.set_level(logging.INFO)
    client = client_for(sender)
    query = "&".join(f"a{i}=1" for i in range(10))
    for path in ("/api/me/grabs/", "/api/ping/"):
        many = client.get(f"{path}?{query}")
        assert many.status_code == 400, many.content
        assert list(many.json()["error"]["fields"]) == ["query"], many.json()
    refused = [r for r in caplog.records if r.name.startswith("django.security.")]
    assert refused and all(r.levelno == logging.WARNING and not r.exc_info for r in refused)


@pytest.mark.parametrize("accept", ["application/json", "text/html"])
def test_a_form_view_given_a_multipart_body_it_cannot_read_answers_400_and_logs_one_line(
    accept, caplog
):
    """The admin's login (a Django form, read before its view by the login throttle): a
    multipart body without a boundary. Django answered 400 and logged its traceback."""
    caplog.set_level(logging.INFO)
    refused = APIClient(raise_request_exception=False).generic(
        "POST",
        "/admin/login/",
        b"username=a&password=b",
        content_type="multipart/form-data",
        HTTP_ACCEPT=accept,
    )
    assert refused.status_code == 400, refused.content
    if accept == "application/json":
        assert list(refused.json()["error"]["fields"]) == ["body"], refused.json()
    logged = [r for r in caplog.records if r.name == "django.request"]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING and not logged[0].exc_info


def form_body(pairs: list[tuple[str, str]], form: str) -> tuple[str, str]:
    """(body, Content-Type) of `pairs` as a multipart or urlencoded form, in order."""
    if form == "urlencoded":
        return "&".join(f"{n}={v}" for n, v in pairs), "application/x-www-form-urlencoded"
    parts = [f'--b0\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n{v}\r\n' for n, v in pairs]
    return "".join(parts) + "--b0--\r\n", "multipart/form-data; boundary=b0"


@pytest.mark.parametrize("form", ["multipart", "urlencoded"])
@pytest.mark.parametrize("field", ["total_amount", "total_count", "strategy"])
def test_a_form_field_given_twice_is_a_400_naming_it(sender, form, field):
    """Django's QueryDict hands the view the last value: a send naming `total_amount` twice
    moved the second amount; a JSON key given twice was already refused."""
    client = client_for(sender)
    pairs = [(name, str(value)) for name, value in VALID.items()]
    before = table_counts()
    body, content_type = form_body([*pairs, (field, str(VALID[field]))], form)
    twice = client.post("/api/activities/", body, content_type=content_type)
    assert twice.status_code == 400, twice.content
    assert list(twice.json()["error"]["fields"]) == [field]
    assert table_counts() == before
    body, content_type = form_body(pairs, form)
    once = client.post("/api/activities/", body, content_type=content_type)
    assert once.status_code == 201, once.content


def test_a_form_refusal_names_no_field_too_long_to_echo_and_a_file_counts_as_a_value(sender):
    client = client_for(sender)
    before = table_counts()
    pairs = [(name, str(value)) for name, value in VALID.items()]
    long_name = "n" * 30_000
    body, content_type = form_body([*pairs, (long_name, "1"), (long_name, "2")], "urlencoded")
    named = client.post("/api/activities/", body, content_type=content_type)
    assert named.status_code == 400 and list(named.json()["error"]["fields"]) == ["body"]
    assert len(named.content) < 1000
    upload = SimpleUploadedFile("amount.txt", b"99.00")
    both = client.post("/api/activities/", {**VALID, "total_amount": ["10.00", upload]})
    assert both.status_code == 400, both.content
    assert list(both.json()["error"]["fields"]) == ["total_amount"]
    assert table_counts() == before


@pytest.mark.parametrize("coding", ["gzip", "x-junk", "br, identity"])
def test_a_body_in_a_content_encoding_is_a_415_naming_it(sender, coding):
    """No parser here decodes a coding: a body read as identity although it says gzip was taken
    (and an actually gzipped one refused as bad JSON)."""
    client = client_for(sender)
    before = table_counts()
    coded = client.post("/api/activities/", VALID, format="json", HTTP_CONTENT_ENCODING=coding)
    assert coded.status_code == 415, coded.content
    assert list(coded.json()["error"]["fields"]) == ["Content-Encoding"]
    assert table_counts() == before
    plain = client.post("/api/activities/", VALID, format="json", HTTP_CONTENT_ENCODING="identity")
    assert plain.status_code == 201, plain.content


@pytest.mark.parametrize("charset", ["bogus-xyz", "", "utf-8x"])
def test_json_declaring_a_charset_no_codec_knows_is_a_400(sender, charset):
    """Django drops a charset it cannot look up, and the body was read as UTF-8."""
    client = client_for(sender)
    before = table_counts()
    odd = client.post(
        "/api/activities/",
        json.dumps(VALID),
        content_type=f"application/json; charset={charset}",
    )
    assert odd.status_code == 400, odd.content
    assert list(odd.json()["error"]["fields"]) == ["body"]
    assert table_counts() == before


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/vnd.api+json", "", "text/" + "x" * 8000],
    ids=["text", "vendor json", "none", "8000 characters"],
)
def test_a_body_of_a_type_no_parser_reads_is_a_415_naming_content_type(sender, content_type):
    """DRF's 415 named nothing; an absent Content-Type is refused the same way."""
    refused = client_for(sender).generic(
        "POST", "/api/activities/", json.dumps(VALID), content_type=content_type
    )
    assert refused.status_code == 415, refused.content
    assert list(refused.json()["error"]["fields"]) == ["Content-Type"]
    assert len(refused.content) < 1000


def test_grab_throttle_answers_429_with_retry_after(
    sender, make_users, settings, one_throttle_window
):
    settings.REDPACK_THROTTLE_RATES = {"grab": "3/min", "send": "2/min"}
    grabber, other = make_users(2)
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy="pessimistic"
    )
    client = client_for(grabber)
    codes = [client.post(f"/api/activities/{activity.pk}/grab/").status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    throttled = client.post(f"/api/activities/{activity.pk}/grab/")
    assert int(throttled["Retry-After"]) > 0
    assert throttled.json()["error"]["code"] == "throttled"
    # The limit is per user: someone else still gets through.
    assert client_for(other).post(f"/api/activities/{activity.pk}/grab/").status_code == 200
    sends = [
        client_for(sender).post("/api/activities/", VALID, format="json").status_code
        for _ in range(3)
    ]
    assert sends == [201, 201, 429]


def test_who_grabbed_what_is_for_the_sender_and_staff(sender, make_users):
    grabber, stranger = make_users(2)
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy="pessimistic"
    )
    services.activity_grab(activity_id=activity.pk, user_id=grabber.pk)
    url = f"/api/activities/{activity.pk}/grabs/"
    rows = client_for(sender).get(url).json()["results"]
    assert [row["user"] for row in rows] == [grabber.pk]
    for user in (stranger, grabber):
        denied = client_for(user).get(url)
        assert denied.status_code == 403
        assert denied.json()["error"]["code"] == "permission_denied"
    stranger.is_staff = True
    stranger.save()
    assert client_for(stranger).get(url).status_code == 200
    assert client_for(stranger).get("/api/activities/999999/grabs/").status_code == 404


def test_token_for_a_user_cannot_grab_for_another(sender, make_users):
    alice, bob = make_users(2)
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy="pessimistic"
    )
    client_for(alice).post(
        f"/api/activities/{activity.pk}/grab/?user_id={bob.pk}",
        {"user": bob.pk, "user_id": bob.pk},
        format="json",
    )
    tampered = str(AccessToken.for_user(alice)).split(".")
    payload = json.loads(_b64decode(tampered[1]))
    payload["user_id"] = bob.pk
    tampered[1] = _b64encode(json.dumps(payload).encode())
    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION="Bearer " + ".".join(tampered))
    assert forged.post(f"/api/activities/{activity.pk}/grab/").status_code == 401
    assert list(GrabDetail.objects.values_list("user_id", flat=True)) == [alice.pk]


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_auth_scheme_is_read_in_any_case(sender, scheme):
    """RFC 9110 11.1: the scheme is case-insensitive; simplejwt took `Bearer` alone."""
    client = APIClient(raise_request_exception=False)
    token = AccessToken.for_user(sender)
    for path in ("/api/ping/", "/api/me/grabs/"):  # a token-only view, one reading the user
        assert client.get(path, HTTP_AUTHORIZATION=f"{scheme} {token}").status_code == 200
        assert client.get(path, HTTP_AUTHORIZATION=f"{scheme}\t{token}").status_code == 200
        alone = client.get(path, HTTP_AUTHORIZATION=scheme)
        assert alone.status_code == 401
    for other in ("Basic", "Token"):  # credentials sent in a scheme not read here, and said so
        refused = client.get("/api/ping/", HTTP_AUTHORIZATION=f"{other} {token}")
        assert refused.status_code == 401
        assert "scheme is not Bearer" in refused.json()["error"]["message"]


def test_expired_token_is_401(sender):
    token = AccessToken.for_user(sender)
    token.set_exp(lifetime=-__import__("datetime").timedelta(seconds=1))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    for path in ("/api/me/grabs/", "/api/ping/"):
        response = client.get(path)
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["code"] == "token_not_valid"
        assert error["message"].endswith("Token is expired"), error  # why, not just that


@pytest.mark.parametrize(
    "claim",
    ["abc", None, [1], {"id": 1}, "2**70", 2**63, 2**31, 1.5, "1.5", True, 0, -5, "-5", ""]
    + ["2147483648", "9" * 5000],
)
def test_a_signed_token_naming_no_possible_user_is_401(sender, claim):
    """A token signed with the server's key whose user id claim is not one: 401, never a 500
    or another user (a `1.5` is not user 1), on the store-less views and the others alike."""
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy="redis_counter"
    )
    token = AccessToken.for_user(sender)
    token["user_id"] = claim
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    for response in (
        client.get("/api/ping/"),
        client.post(f"/api/activities/{activity.pk}/grab/"),
        client.get("/api/me/grabs/"),
        client.post("/api/activities/", VALID, format="json"),
    ):
        assert response.status_code == 401, (claim, response.content)
        assert response.json()["error"]["code"] == "token_not_valid"
    refresh = RefreshToken.for_user(sender)
    refresh["user_id"] = claim
    response = APIClient().post("/api/token/refresh/", {"refresh": str(refresh)}, format="json")
    assert response.status_code == 401, (claim, response.content)
    assert not GrabDetail.objects.exists()


@pytest.mark.parametrize("exp", [10**30, 1e308, 2**63, -(10**30)])
def test_a_signed_token_whose_expiry_is_no_time_is_401(sender, exp):
    """An `exp` no datetime can hold, signed with the server's key: 401, not an OverflowError's
    500, for an access token on either kind of view and for a refresh token."""
    token = AccessToken.for_user(sender)
    token["exp"] = exp
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    for response in (client.get("/api/ping/"), client.get("/api/me/wallet/")):
        assert response.status_code == 401, (exp, response.content)
        assert response.json()["error"]["code"] == "token_not_valid"
    refresh = RefreshToken.for_user(sender)
    refresh["exp"] = exp
    response = APIClient(raise_request_exception=False).post(
        "/api/token/refresh/", {"refresh": str(refresh)}, format="json"
    )
    assert response.status_code == 401, (exp, response.content)


@pytest.mark.parametrize("path", ["/api/docs/", "/api/docs", "/api/schema/"])
def test_the_schema_and_its_ui_answer_other_methods_in_json(path):
    """They render YAML or HTML for a GET; an OPTIONS is described and a POST refused in JSON
    (the UI's template renderer made the OPTIONS a 500 and the 405 an HTML page)."""
    client = APIClient(raise_request_exception=False)
    described = client.options(path)
    assert described.status_code == 200 and described["Content-Type"] == "application/json"
    for method in (client.post, client.put, client.delete):
        refused = method(path)
        assert refused.status_code == 405 and refused["Content-Type"] == "application/json"
        assert refused.json()["error"]["code"] == "method_not_allowed"
        assert list(refused.json()["error"]["fields"]) == ["method"]
    assert client.get(path).status_code == 200


def test_the_schema_and_its_ui_ignore_a_stale_token_and_answer_their_errors_in_json():
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION="Bearer a.b.c")
    assert client.get("/api/docs/").status_code == 200
    assert client.get("/api/schema/").status_code == 200
    for path in ("/api/docs/?format=json", "/api/schema/?format=xml"):
        refused = client.get(path)
        assert refused.status_code == 406 and refused["Content-Type"] == "application/json"
        assert list(refused.json()["error"]["fields"]) == ["format"]
    odd = client.get("/api/docs/", HTTP_ACCEPT="application/json")
    assert odd.status_code == 406 and odd["Content-Type"] == "application/json"
    assert list(odd.json()["error"]["fields"]) == ["Accept"]


@pytest.mark.parametrize(
    ("query", "accept", "field", "offered"),
    [
        ("?format=xml", "", "format", "json"),
        ("?format=" + "x" * 5000, "", "format", "json"),
        ("", "application/xml", "Accept", "application/json"),
        ("", "text/csv;q=1, image/*", "Accept", "application/json"),
        ("", "application/json;q=0", "Accept", "application/json"),  # weight 0: not acceptable
        ("", "*/*; q=0.000", "Accept", "application/json"),
        ("", "application/*;q=0, image/png", "Accept", "application/json"),
    ],
)
def test_an_answer_in_a_form_the_path_does_not_give_is_a_406_naming_what_asked(
    sender, query, accept, field, offered
):
    """DRF answered an unknown `?format=` 404, as if the path served nothing, and an Accept it
    cannot satisfy 406 naming nothing. The grab's refusal comes before anything is taken."""
    client = client_for(sender)
    activity = services.activity_send(
        sender_id=sender.id, total_amount="1.00", total_count=1, strategy="pessimistic"
    )
    headers = {"HTTP_ACCEPT": accept} if accept else {}
    for refused in (
        client.get(f"/api/ping/{query}", **headers),
        client.post(f"/api/activities/{activity.id}/grab/{query}", **headers),
    ):
        assert refused.status_code == 406, refused.content
        assert refused["Content-Type"] == "application/json"
        error = refused.json()["error"]
        assert error["code"] == "not_acceptable" and list(error["fields"]) == [field]
        assert offered in error["message"] and len(refused.content) < 1000
    assert not GrabDetail.objects.filter(activity_id=activity.id).exists()
    assert client.get("/api/ping/?format=json").json() == {"pong": True}


@pytest.mark.parametrize(
    "accept",
    [
        "application/json;q=0.5",
        "text/html;q=0, */*",
        "*/*;q=0, application/json",
        "application/json;q=-1, text/html;q=0",  # a weight RFC 9110 does not write: none
        "application/json;q=nan, text/html;q=0",
        "application/json;version=2;q=0, */*",  # a range with a parameter: not plain JSON
    ],
)
def test_an_accept_that_weighs_json_above_0_is_answered_in_json(sender, accept):
    answered = client_for(sender).get("/api/ping/", HTTP_ACCEPT=accept)
    assert answered.status_code == 200 and answered.json() == {"pong": True}


def test_a_format_and_an_accept_that_ask_for_different_answers_are_both_named(sender):
    """The refusal lists what the format leaves, not every type the path answers in."""
    client = client_for(sender)
    for query, accept, left in [
        ("?format=api", "application/json", "text/html"),
        ("?format=json", "text/html", "application/json"),
    ]:
        refused = client.get(f"/api/me/wallet/{query}", HTTP_ACCEPT=accept)
        assert refused.status_code == 406, refused.content
        error = refused.json()["error"]
        assert sorted(error["fields"]) == ["Accept", "format"]
        assert error["message"].endswith(f"answers in: {left}")


def test_a_refresh_token_whose_claims_cannot_be_signed_again_is_401(sender):
    """A signed `iss` that is not a string: the access token made from it could not be
    signed; the refresh is refused, not a 500."""
    from django.conf import settings
    from jwt.api_jws import PyJWS

    payload = dict(RefreshToken.for_user(sender).payload, iss=1)  # PyJWT signs no such iss
    signed = PyJWS().encode(json.dumps(payload).encode(), settings.SECRET_KEY, algorithm="HS256")
    response = APIClient(raise_request_exception=False).post(
        "/api/token/refresh/", {"refresh": signed}, format="json"
    )
    assert response.status_code == 401, response.content
    assert response.json()["error"]["code"] == "token_not_valid"


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
def test_the_probes_refuse_other_methods_in_json_before_any_csrf_check(path):
    client = APIClient(enforce_csrf_checks=True, raise_request_exception=False)
    for method in (client.post, client.put, client.delete):
        refused = method(path)
        assert refused.status_code == 405, refused.content
        assert refused.json()["error"]["code"] == "method_not_allowed"
        assert list(refused.json()["error"]["fields"]) == ["method"]
        assert refused["Allow"] == "GET, HEAD"
    assert client.get("/healthz").status_code in (200, 503)


@pytest.mark.parametrize(
    ("path", "accept", "json_answer"),
    [
        ("/API/", "", True),  # not the API's path (case counts), but its shape
        ("/Api/activities/1/grab/", "*/*", True),
        ("/nowhere/", "application/json", True),  # a client that asks for JSON
        ("/nowhere/", "", False),  # a page's 404 for a browser or anyone else
        ("/nowhere/", "text/html,application/json;q=0.9", False),
    ],
)
def test_a_path_nothing_serves_is_a_404_in_json_for_the_api_and_for_json_clients(
    path, accept, json_answer
):
    missing = APIClient().get(path, HTTP_ACCEPT=accept) if accept else APIClient().get(path)
    assert missing.status_code == 404
    if json_answer:
        assert missing["Content-Type"] == "application/json"
        assert missing.json()["error"]["code"] == "not_found"
    else:
        assert missing["Content-Type"].startswith("text/html")
    assert int(missing["Content-Length"]) == len(missing.content)


def test_session_auth_keeps_csrf_and_names_what_failed(sender):
    sender.set_password("pass-word-123")
    sender.save()
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username=sender.username, password="pass-word-123")
    assert client.get("/api/me/grabs/").status_code == 200
    token = "a" * 32
    for cookie, header, named in [
        (None, None, "csrftoken"),
        (token, None, "X-Csrftoken"),
        (token, "b" * 32, "X-Csrftoken"),
        (token, "short", "X-Csrftoken"),
    ]:
        if cookie:
            client.cookies["csrftoken"] = cookie
        extra = {} if header is None else {"HTTP_X_CSRFTOKEN": header}
        response = client.post("/api/activities/", VALID, format="json", **extra)
        assert response.status_code == 403, (cookie, header)
        error = response.json()["error"]
        assert "CSRF" in error["message"] and error["code"] == "permission_denied"
        assert list(error["fields"]) == [named], (cookie, header, error)
    answered = client.post("/api/activities/", VALID, format="json", HTTP_X_CSRFTOKEN=token)
    assert answered.status_code == 201, answered.content
    assert Activity.objects.count() == 1


def test_a_401_names_the_authorization_header_where_the_view_reads_it(sender):
    """Missing, malformed, forged or expired: the header is named, on the token-only views
    (the grab, the ping) and on those that read the user's row."""
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy="redis_counter"
    )
    expired = AccessToken.for_user(sender)
    expired.set_exp(lifetime=-__import__("datetime").timedelta(seconds=1))
    for header, code in [
        (None, "not_authenticated"),
        ("Basic dXNlcjpwdw==", "not_authenticated"),
        ("Bearer", "bad_authorization_header"),
        ("Bearer not.a.token", "token_not_valid"),
        (f"Bearer {expired}", "token_not_valid"),
    ]:
        client = APIClient(raise_request_exception=False)
        if header is not None:
            client.credentials(HTTP_AUTHORIZATION=header)
        for response in (
            client.post(f"/api/activities/{activity.pk}/grab/"),
            client.get("/api/ping/"),
            client.get("/api/me/wallet/"),
            client.post("/api/activities/", VALID, format="json"),
        ):
            assert response.status_code == 401, (header, response.content)
            error = response.json()["error"]
            assert error["code"] == code, (header, error)
            assert error["fields"] == {"Authorization": [error["message"]]}, (header, error)
    assert not GrabDetail.objects.exists()


def test_the_token_views_401_names_the_fields_of_the_body_they_judged(sender):
    client = APIClient(raise_request_exception=False)
    login = client.post("/api/token/", {"username": sender.username, "password": "no"})
    assert login.status_code == 401, login.content
    assert login.json()["error"]["code"] == "no_active_account"
    assert sorted(login.json()["error"]["fields"]) == ["password", "username"]
    refresh = client.post("/api/token/refresh/", {"refresh": "not.a.token"}, format="json")
    assert refresh.status_code == 401, refresh.content
    assert refresh.json()["error"]["code"] == "token_not_valid"
    assert list(refresh.json()["error"]["fields"]) == ["refresh"]


def test_check_deploy_is_clean_with_production_settings():
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "DJANGO_SETTINGS_MODULE"}}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "redpack.settings",
            "DEBUG": "0",
            "HTTPS": "1",
            "SECRET_KEY": "kq3v9X2m-Pz8yL5nR1tW7cB4hJ6dF0gS_aE9uI3oK2xV8bN5mQ1wZ7rT4yU6pL0j",
            "ALLOWED_HOSTS": "redpack.example.com",
        }
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def _b64decode(part: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _b64encode(raw: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# Strategies that write MySQL before answering (the asynchronous one answers from Redis alone
# and trusts the signed token: a grab by a deleted user ends in its dead letters).
WRITES_BEFORE_ANSWER = [
    n for n in registry.names() if registry.get(n).safe and registry.get(n).persist_lag() is None
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", WRITES_BEFORE_ANSWER)
def test_a_token_outliving_its_user_cannot_grab(strategy, sender, make_users):
    safe_strategy = strategy
    ghost = make_users(1, balance="0")[0]  # a user with a wallet cannot be deleted
    token = AccessToken.for_user(ghost)
    get_user_model().objects.filter(pk=ghost.pk).delete()
    # As if the ban never reached Redis (redpack/bans.py refuses the token first, with 401):
    # the strategies refuse a user that does not exist on their own.
    get_redis_connection("default").srem(bans.KEY, ghost.pk)
    bans.forget()
    activity = services.activity_send(
        sender_id=sender.pk, total_amount="5.00", total_count=5, strategy=safe_strategy
    )
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.post(f"/api/activities/{activity.pk}/grab/")
    assert response.status_code in {403, 409}, response.content
    assert not GrabDetail.objects.filter(activity=activity).exists()


def test_a_deactivated_users_token_is_named_so_on_every_kind_of_view(sender):
    """The views that read the user's row (simplejwt's errors, a code and message in a dict)
    say `user_inactive` as the token-only views do, not a generic code."""
    client = client_for(sender)
    sender.is_active = False
    sender.save()
    for response in (client.get("/api/me/wallet/"), client.get("/api/me/grabs/")):
        assert response.status_code == 401, response.content
        error = response.json()["error"]
        assert error["code"] == "user_inactive" and error["message"], error
