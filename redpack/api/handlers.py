"""Django-level error views: JSON under /api/ (the DRF handler's shape), HTML elsewhere."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

from .errors import error_body


def _wants_json(request: HttpRequest) -> bool:
    return request.path.startswith(("/api/", "/healthz"))


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse(error_body("not_found", "not found"), status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse(error_body("bad_request", "the request could not be read"), status=400)
    return defaults.bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse(error_body("server_error", "internal error"), status=500)
    return defaults.server_error(request)
