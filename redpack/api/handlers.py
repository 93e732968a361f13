"""Django-level error views: JSON under /api/ (the DRF handler's shape), HTML elsewhere."""

import sys

from django.contrib.admin.exceptions import (
    DisallowedModelAdminLookup,
    DisallowedModelAdminToField,
)
from django.core.exceptions import (
    DisallowedHost,
    RequestDataTooBig,
    SuspiciousMultipartForm,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.http.multipartparser import MultiPartParserError
from django.views import defaults
from rest_framework.permissions import SAFE_METHODS

from redpack import metrics, services
from redpack.errors import Unavailable

from .errors import answer_parts, error_body


def _wants_json(request: HttpRequest) -> bool:
    # `//api/...` or `api/...` (a request target without its leading slash) is the API's too,
    # and so is `/API/...` (paths are case-sensitive: it is a 404, in the API's shape); the
    # probes' paths answer in JSON, and so does what is near them (`/metrics/`); anywhere, a
    # client that asks for JSON and not for HTML gets JSON.
    if request.path.lstrip("/").lower().startswith(("api/", "healthz", "metrics")):
        return True
    accept = request.headers.get("Accept", "")
    return "json" in accept and "html" not in accept


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse(error_body("not_found", "not found"), status=404)
    return defaults.page_not_found(request, exception)


# What Django refused before any view, named in the answer: the first entry the exception is an
# instance of (none: the request as a whole).
_REFUSED_PARTS: tuple[tuple[type[Exception], str, str], ...] = (
    (DisallowedHost, "Host", "this host is not served here"),
    (TooManyFieldsSent, "body", "too many fields"),
    (TooManyFilesSent, "body", "too many files"),
    (RequestDataTooBig, "body", "request body too large"),
    (SuspiciousMultipartForm, "body", "malformed multipart body"),
    (MultiPartParserError, "body", "malformed multipart body"),  # as a form view reads it
    (DisallowedModelAdminToField, "query", "the admin does not look objects up by that field"),
    (DisallowedModelAdminLookup, "query", "the admin does not filter by that lookup"),
)


# The kinds above that Django logs at ERROR with a traceback (django.security.<kind>), each the
# client's fault: redpack.logs.demote_client_refusals makes them one WARNING line.
# (MultiPartParserError, logged on django.request with its traceback: redpack.logs.
# OneLinePerRefusal drops the traceback.)
CLIENT_REFUSALS = tuple(
    kind for kind, _, _ in _REFUSED_PARTS if issubclass(kind, SuspiciousOperation)
)


def _part(request: HttpRequest, exception: Exception, part: str) -> str:
    """`part`, or `query` for too many fields that the query string holds (Django applies the
    limit to the query's fields and, apart, to a form body's)."""
    if isinstance(exception, TooManyFieldsSent):
        try:
            QueryDict(request.META.get("QUERY_STRING", ""))
        except TooManyFieldsSent:
            return "query"
    return part


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _wants_json(request):
        for kind, part, message in _REFUSED_PARTS:
            if isinstance(exception, kind):
                part = _part(request, exception, part)
                return JsonResponse(
                    error_body("bad_request", message, {part: [message]}), status=400
                )
        return JsonResponse(error_body("bad_request", "the request could not be read"), status=400)
    return defaults.bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """500; but 503 with Retry-After when what failed is a store that could not be reached or
    takes no command now (services.store_unreachable): a page outside the API's views (the
    admin's, whose session and user come from MySQL), as the API's handler answers."""
    failed = sys.exc_info()[1]  # Django calls this while it handles the view's exception
    if failed is not None and services.store_unreachable(failed):
        metrics.store_error(failed, "page")
        unavailable = Unavailable(wrote=request.method not in SAFE_METHODS)
        body, code, headers = answer_parts(unavailable)
        if _wants_json(request):
            return JsonResponse(body, status=code, headers=headers)
        return HttpResponse(
            unavailable.message,
            status=code,
            headers=headers,
            content_type="text/plain; charset=utf-8",
        )
    if _wants_json(request):
        return JsonResponse(error_body("server_error", "internal error"), status=500)
    return defaults.server_error(request)
