"""The pages for people (the API's views are in api/views.py): the landing page at `/`."""

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from strategies import registry


@csrf_exempt  # it changes nothing: another method than GET or HEAD is a 405, not a CSRF 403
@require_safe
def home(request: HttpRequest) -> HttpResponse:
    """What this is and where to go: admin, API docs, health, Locust, the latest report."""
    links = [
        ("Admin", reverse("admin:index"), "create activities, watch them being grabbed, refunds"),
        ("API docs", reverse("docs"), "every endpoint, tried from the browser (Swagger UI)"),
        ("API", reverse("api-root"), "the endpoints as JSON; a token from POST /api/token/"),
        ("Health", reverse("healthz"), "ok, degraded or down"),
        (
            "Latest comparison",
            reverse("admin:redpack_activity_report"),
            "the strategies measured on this machine (`make compare`), with a recommendation",
        ),
    ]
    if settings.REDPACK_LOCUST_URL:
        links.insert(
            4, ("Locust", settings.REDPACK_LOCUST_URL, "load tests: pick a strategy, see its audit")
        )
    strategies = [
        {
            "name": name,
            "label": registry.get(name).label,
            "unavailable_reason": registry.unavailable_reason(name),
        }
        for name in registry.names()
    ]
    context = {"links": links, "strategies": strategies, "locust_url": settings.REDPACK_LOCUST_URL}
    return TemplateResponse(request, "redpack/home.html", context)
