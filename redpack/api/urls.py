"""The API's routes. Each is named with its trailing slash (as the docs and the schema give it)
and answered without it too: a client that leaves the slash off reaches the same view instead
of Django's redirect (APPEND_SLASH), a 301 whose POST most clients would turn into a GET."""

from collections.abc import Callable
from typing import Any

from django.urls import URLPattern, path

from . import views


def slashless(route_path: str) -> str:
    """The alias a route is answered at too: its path without the trailing slash."""
    return route_path.removesuffix("/")


def route(pattern: str, view: Callable[..., Any], name: str) -> list[URLPattern]:
    """`pattern` (ending in a slash) under `name`, and its `slashless` alias."""
    return [path(pattern, view, name=name), path(slashless(pattern), view)]


urlpatterns = [
    path("", views.ApiRootView.as_view(), name="api-root"),
    *route("activities/", views.ActivityCreateView.as_view(), "activity-create"),
    *route("activities/<int:pk>/", views.ActivityDetailView.as_view(), "activity-detail"),
    *route("activities/<int:pk>/grab/", views.GrabView.as_view(), "activity-grab"),
    *route("activities/<int:pk>/grabs/", views.ActivityGrabsView.as_view(), "activity-grabs"),
    *route("me/grabs/", views.MyGrabsView.as_view(), "my-grabs"),
    *route("me/refunds/", views.MyRefundsView.as_view(), "my-refunds"),
    *route("me/wallet/", views.MyWalletView.as_view(), "my-wallet"),
    *route("ping/", views.PingView.as_view(), "ping"),
    *route("strategies/", views.StrategyListView.as_view(), "strategies"),
    *route("token/", views.LoginView.as_view(), "token-obtain"),
    *route("token/refresh/", views.RefreshView.as_view(), "token-refresh"),
    *route("schema/", views.SchemaView.as_view(), "schema"),
    *route("docs/", views.DocsView.as_view(url_name="schema"), "docs"),
]
