"""The landing page at `/`: every link answers; the API docs render without the internet."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


def links(body: str) -> list[str]:
    return re.findall(r'<a href="([^"#]+)"', body)


def test_every_link_of_the_landing_page_answers(client):
    get_user_model().objects.create_superuser("boss", "boss@example.com", "boss-pass-123")
    page = client.get("/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "red packets" in body and "Strategies on this server" in body
    found = links(body)
    for expected in (
        "/admin/",
        "/api/docs/",
        "/api/",
        "/healthz",
        "/admin/redpack/activity/report/",
    ):
        assert expected in found
    client.login(username="boss", password="boss-pass-123")
    for url in found:
        response = client.get(url, follow=True)
        assert response.status_code == 200, url
    # The admin's "View site" is this page.
    assert '<a href="/">View site</a>' in client.get("/admin/").content.decode()


def test_the_landing_page_is_read_with_get_or_head_only(client):
    assert client.head("/").status_code == 200
    for method in ("post", "put", "delete", "options", "trace"):
        refused = getattr(client, method)("/")
        assert refused.status_code == 405, method
        assert refused["Allow"] == "GET, HEAD"
        assert b"<html" not in refused.content


def test_the_landing_page_links_locust_and_says_embedded_when_make_run_says_so(client):
    with override_settings(
        REDPACK_LOCUST_URL="http://127.0.0.1:8089/", REDPACK_EMBEDDED="embedded SQLite"
    ):
        body = client.get("/").content.decode()
    assert "http://127.0.0.1:8089/" in links(body)
    assert 'id="embedded-ribbon"' in body
    body = client.get("/").content.decode()
    assert "8089" not in body and 'id="embedded-ribbon"' not in body


def test_api_docs_load_nothing_from_another_host():
    """Swagger UI comes from drf-spectacular-sidecar's static files, served here (the browser
    walk, tests/test_first_hour.py, sees it render)."""
    page = Client().get("/api/docs/")
    assert page.status_code == 200
    body = page.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', body)
    assert sources and all(s.startswith("/") for s in sources), sources
    assert any("swagger-ui-bundle.js" in s for s in sources)
    for source in sources:  # static files of this project (collectstatic, whitenoise serves them)
        assert finders.find(source.removeprefix("/static/")), source
    assert "cdn" not in body.lower()


def test_the_api_root_lists_the_endpoints():
    response = Client().get("/api/")
    assert response.status_code == 200
    endpoints = response.json()["endpoints"]
    assert endpoints["docs"] == "/api/docs/" and endpoints["strategies"] == "/api/strategies/"
    assert endpoints["my-wallet"] == "/api/me/wallet/" and endpoints["ping"] == "/api/ping/"
