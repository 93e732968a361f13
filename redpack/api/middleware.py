from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from .errors import error_body


class RequestSizeLimitMiddleware:
    """413 for a declared body above DATA_UPLOAD_MAX_MEMORY_SIZE, before anything reads it.

    Bodies without a Content-Length still stop at the same limit when Django reads them (400).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse(error_body("bad_request", "invalid Content-Length"), status=400)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and length > limit:
            return JsonResponse(
                error_body("too_large", f"request body over {limit} bytes"), status=413
            )
        return self.get_response(request)
