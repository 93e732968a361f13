"""The HTTP contract, through DRF's test client with real tokens, MariaDB and Redis."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient
from rest_framework_simplejwt.tokens import AccessToken

from redpack import ledger, services
from redpack.models import Activity, GrabDetail

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AccessToken.for_user(user)}")
    return client


def send(client: APIClient, **overrides):  # type: ignore[no-untyped-def]
    body = {
        "total_amount": "100.00",
        "total_count": 10,
        "strategy": "pessimistic",
        "allocation": "double_average",
        "expires_in": 86400,
        **overrides,
    }
    return client.post("/api/activities/", body, format="json")


def test_send_grab_view_and_list(sender, make_users):
    grabber = make_users(1)[0]
    response = send(client_for(sender))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["sender"] == sender.pk
    assert body["status"] == "open"
    assert body["remaining_count"] == 10 and body["remaining_amount"] == "100.00"

    grab = client_for(grabber).post(f"/api/activities/{body['id']}/grab/")
    assert grab.status_code == 200
    assert grab.json()["outcome"] == "grabbed"
    amount = Decimal(grab.json()["amount"])
    again = client_for(grabber).post(f"/api/activities/{body['id']}/grab/")
    assert again.json() == {"outcome": "already_grabbed", "amount": grab.json()["amount"]}

    state = client_for(grabber).get(f"/api/activities/{body['id']}/").json()
    assert state["remaining_count"] == 9
    assert Decimal(state["remaining_amount"]) == Decimal("100.00") - amount
    assert state["grabbed_count"] == 1
    assert state["refunded_amount"] is None

    mine = client_for(grabber).get("/api/me/grabs/").json()
    assert mine["count"] == 1
    assert mine["results"][0]["activity"] == body["id"]
    assert mine["results"][0]["amount"] == grab.json()["amount"]
    assert client_for(sender).get("/api/me/grabs/").json()["count"] == 0

    services.activity_expire(activity_id=body["id"], force=True)
    state = client_for(grabber).get(f"/api/activities/{body['id']}/").json()
    assert state["status"] == "refunded"
    assert state["refunded_amount"] == str(Decimal("100.00") - amount)  # a decimal string


def test_sold_out_answer(sender, make_users):
    first, second = make_users(2)
    activity_id = send(client_for(sender), total_count=1, total_amount="0.01").json()["id"]
    assert client_for(first).post(f"/api/activities/{activity_id}/grab/").json() == {
        "outcome": "grabbed",
        "amount": "0.01",
    }
    assert client_for(second).post(f"/api/activities/{activity_id}/grab/").json() == {
        "outcome": "sold_out"
    }


def test_grab_authenticates_without_touching_the_user_table(sender, make_users):
    grabber = make_users(1)[0]
    activity_id = send(client_for(sender)).json()["id"]
    client = client_for(grabber)
    client.post(f"/api/activities/{activity_id}/grab/")  # warms the strategy lookup
    with CaptureQueriesContext(connection) as queries:
        response = client.post(f"/api/activities/{activity_id}/grab/")
    assert response.json()["outcome"] == "already_grabbed"
    assert not [q for q in queries.captured_queries if "auth_user" in q["sql"]]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"total_amount": "0.00"}, "total_amount"),
        ({"total_amount": "-1"}, "total_amount"),
        ({"total_amount": "1.001"}, "total_amount"),
        ({"total_amount": "abc"}, "total_amount"),
        ({"total_amount": "0.09", "total_count": 10}, "total_amount"),
        ({"total_amount": "99999999999.99"}, "total_amount"),
        ({"total_count": 0}, "total_count"),
        ({"total_count": 10_001}, "total_count"),
        ({"total_count": "ten"}, "total_count"),
        ({"total_count": "2"}, "total_count"),  # a string: a JSON integer is asked for
        ({"expires_in": "60"}, "expires_in"),
        ({"strategy": "nope"}, "strategy"),
        ({"allocation": "lottery"}, "allocation"),
        ({"expires_in": 0}, "expires_in"),
        ({"expires_in": 10**12}, "expires_in"),
    ],
)
def test_bad_send_input_is_a_400_naming_the_field(sender, overrides, field):
    response = send(client_for(sender), **overrides)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    assert Activity.objects.count() == 0


@pytest.mark.parametrize("form", ["multipart", "urlencoded"])
def test_a_send_in_a_form_gives_its_integers_as_strings(sender, form):
    """A form's values are all strings (the browsable API's form): its digits are integers,
    where in JSON the same string is refused."""
    fields = {"total_amount": "3.00", "total_count": "3", "strategy": "pessimistic"}
    fields["expires_in"] = "60"
    client = client_for(sender)
    if form == "multipart":
        response = client.post("/api/activities/", fields, format="multipart")
    else:
        body = "&".join(f"{name}={value}" for name, value in fields.items())
        response = client.post(
            "/api/activities/", body, content_type="application/x-www-form-urlencoded"
        )
    assert response.status_code == 201, response.content
    assert response.json()["total_count"] == 3


def test_missing_field_and_malformed_json(sender):
    client = client_for(sender)
    response = client.post("/api/activities/", {"total_count": 3}, format="json")
    assert response.status_code == 400
    assert {"total_amount", "strategy"} <= set(response.json()["error"]["fields"])
    response = client.post("/api/activities/", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"


@pytest.mark.parametrize("path", ["/api/activities/", "/api/token/", "/api/token/refresh/"])
@pytest.mark.parametrize("body", ["[]", "null", '"x"', "12", "true"])
def test_a_json_body_that_is_no_object_names_the_body(sender, path, body):
    response = client_for(sender).post(path, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["body"], response.json()


@pytest.mark.parametrize(
    "path",
    [
        "/api/activities/999999/",
        "/api/activities/999999/grab/",
        f"/api/activities/{2**70}/grab/",
        f"/api/activities/{2**70}/",
    ],
)
def test_unknown_activity_is_a_404(sender, path):
    """Naming `id`; an id no activity can have (thousands of digits) is not said back."""
    client = client_for(sender)
    response = client.post(path) if path.endswith("grab/") else client.get(path)
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], list(error["fields"])) == ("not_found", ["id"])
    assert str(2**70) not in response.content.decode()


@pytest.mark.parametrize("field", ["strategy", "allocation"])
def test_a_choice_refused_quotes_at_most_the_start_of_what_was_sent(sender, field):
    response = send(client_for(sender), **{field: "x" * 60_000})
    assert response.status_code == 400
    assert len(response.content) < 500, len(response.content)
    assert list(response.json()["error"]["fields"]) == [field]


@pytest.mark.parametrize("path", ["/api/activities/abc/grab/", "/api/nowhere/"])
def test_unknown_api_path_is_a_json_404(sender, path):
    response = client_for(sender).post(path)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/activities/"),
        ("get", "/api/activities/1/"),
        ("post", "/api/activities/1/grab/"),
        ("get", "/api/me/grabs/"),
        ("get", "/api/strategies/"),
    ],
)
def test_every_api_call_needs_authentication(method, path):
    response = getattr(APIClient(), method)(path)
    assert response.status_code == 401
    assert response.json()["error"]["code"] in {"not_authenticated", "authentication_failed"}


def test_forged_and_malformed_tokens_are_401(sender, settings):
    token = AccessToken.for_user(sender)
    forged = str(token)[:-4] + ("AAAA" if not str(token).endswith("AAAA") else "BBBB")
    for header in [f"Bearer {forged}", "Bearer not.a.token", "Bearer", "Basic Zm9vOmJhcg=="]:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        for response in [client.post("/api/activities/1/grab/"), client.get("/api/me/grabs/")]:
            assert response.status_code == 401, (header, response.content)
            assert "error" in response.json()


def test_token_issuance(sender):
    sender.set_password("s3cret-pass")
    sender.save()
    response = APIClient().post(
        "/api/token/", {"username": sender.username, "password": "s3cret-pass"}, format="json"
    )
    assert response.status_code == 200
    access = response.json()["access"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {access}")
    assert client.get("/api/strategies/").status_code == 200
    wrong = APIClient().post(
        "/api/token/", {"username": sender.username, "password": "x"}, format="json"
    )
    assert wrong.status_code == 401


def test_strategies_list(sender):
    rows = client_for(sender).get("/api/strategies/").json()
    by_name = {row["name"]: row for row in rows}
    assert by_name["pessimistic"]["safe"] is True
    assert by_name["pessimistic"]["allowed"] is True
    assert all(row["label"] and row["tradeoff"] for row in rows)


def test_a_strategy_not_available_here_is_refused_with_the_reason(sender):
    """`unsafe` is configured but not allowed (REDPACK_ALLOW_UNSAFE_STRATEGIES is off)."""
    response = send(client_for(sender), strategy="unsafe")
    assert response.status_code == 400
    error = response.json()["error"]
    (message,) = error["fields"]["strategy"]
    assert "not available here" in message and "REDPACK_ALLOW_UNSAFE_STRATEGIES" in message
    unknown = send(client_for(sender), strategy="pessimistc").json()["error"]["fields"]
    assert "is not a valid choice" in unknown["strategy"][0]
    assert not Activity.objects.exists()


def test_schema_docs_and_healthz_are_public():
    schema = APIClient().get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/activities/{id}/grab/" in paths
    assert APIClient().get("/api/docs/").status_code == 200
    health = APIClient().get("/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "degraded"}  # serving; no worker heartbeat in this test


def test_a_path_without_its_trailing_slash_reaches_the_same_view(sender, make_users):
    """No redirect: a 301 would turn most clients' POST into a GET and lose the grab."""
    grabber = make_users(1)[0]
    activity_id = send(client_for(sender)).json()["id"]
    grab = client_for(grabber).post(f"/api/activities/{activity_id}/grab")
    assert grab.status_code == 200, grab.content
    assert grab.json()["outcome"] == "grabbed"
    again = client_for(grabber).post(f"/api/activities/{activity_id}/grab/")
    assert again.json() == {"outcome": "already_grabbed", "amount": grab.json()["amount"]}
    assert client_for(grabber).get("/api/ping").json() == {"pong": True}
    created = client_for(sender).post(
        "/api/activities",
        {
            "total_amount": "1.00",
            "total_count": 1,
            "strategy": "pessimistic",
            "allocation": "double_average",
            "expires_in": 600,
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    assert APIClient().post("/api/activities/1/grab").status_code == 401
    missing = client_for(sender).get("/api/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_the_schema_names_each_route_once_as_its_name_gives_it():
    paths = APIClient().get("/api/schema/?format=json").json()["paths"]
    assert not [path for path in paths if path + "/" in paths]  # no slashless alias
    assert "/api/activities/{id}/grab/" in paths and "/api/ping/" in paths
    assert "/healthz/details" in paths  # routed without a slash, and only so


def test_grab_of_a_user_only_counts_for_the_token_owner(sender, make_users):
    alice, bob = make_users(2)
    activity_id = send(client_for(sender)).json()["id"]
    client_for(alice).post(
        f"/api/activities/{activity_id}/grab/", {"user_id": bob.pk}, format="json"
    )
    assert list(GrabDetail.objects.values_list("user_id", flat=True)) == [alice.pk]


def test_a_send_beyond_the_balance_is_400_naming_the_field(make_users):
    (poor,) = make_users(1, prefix="poor", balance="50.00")
    response = send(client_for(poor), total_amount="60.00")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "insufficient_balance"
    assert list(response.json()["error"]["fields"]) == ["total_amount"]
    assert not Activity.objects.exists()
    assert client_for(poor).get("/api/me/wallet/").json()["balance"] == "50.00"


def test_my_wallet_shows_the_balance_and_each_movement(make_users):
    (sender,) = make_users(1, prefix="sender", balance="100.00")
    (grabber,) = make_users(1, balance="0")
    empty = client_for(grabber).get("/api/me/wallet/").json()
    assert empty == {"balance": "0.00", "count": 0, "next": None, "previous": None, "results": []}
    activity_id = send(client_for(sender), total_amount="10.00", total_count=2).json()["id"]
    amount = client_for(grabber).post(f"/api/activities/{activity_id}/grab/").json()["amount"]
    ledger.grabs_credit(batch=10, run_seconds=60)

    mine = client_for(grabber).get("/api/me/wallet/").json()
    assert mine["balance"] == amount and mine["count"] == 1
    assert mine["results"][0] | {"entry": 0, "created_at": ""} == {
        "entry": 0,
        "kind": "credit",
        "activity": activity_id,
        "amount": amount,
        "created_at": "",
    }
    theirs = client_for(sender).get("/api/me/wallet/?limit=1").json()
    assert theirs["balance"] == "90.00" and theirs["count"] == 2  # the deposit, the send
    assert [(r["kind"], r["amount"]) for r in theirs["results"]] == [("send", "-10.00")]
    assert theirs["next"] is not None
    assert client_for(sender).get("/api/me/wallet/?limit=0").status_code == 400
