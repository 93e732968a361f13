"""One JSON error shape for every 4xx:

{"error": {"code": "...", "message": "...", "fields": {"<field>": ["..."]}}}
"""

import logging
from typing import Any

from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.permissions import SAFE_METHODS
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from redpack import metrics, services
from redpack.errors import RedpackError, Unavailable

logger = logging.getLogger(__name__)

# Characters of a client's value (a format, a coding, a charset, a type) named back in an
# error's message, at most; a field name longer than it is not named (`body` instead).
ECHOED = 40


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def answer_parts(exc: RedpackError) -> tuple[dict[str, Any], int, dict[str, str]]:
    """The body, status and headers (Retry-After, when it has one) `exc` is answered with."""
    fields = {exc.field: [exc.message]} if exc.field else {}
    headers = {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
    return error_body(exc.code, exc.message, fields), exc.status, headers


# A 401: no credentials, or credentials refused (simplejwt's InvalidToken among them).
AUTHENTICATION_REFUSED = (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)


def name_fields(exc: exceptions.APIException, *fields: str) -> None:
    """Have a refusal raised by DRF or simplejwt, which names nothing, name `fields`."""
    exc.fields = fields  # type: ignore[attr-defined]


def _authenticates(context: dict[str, Any]) -> bool:
    """Whether the view reads credentials from the request's headers (the token views take
    theirs from the body, and name its fields themselves: api/views.py)."""
    return bool(getattr(context.get("request"), "authenticators", ()))


def _sent_credentials(context: dict[str, Any]) -> bool:
    """Whether the request sent an Authorization header (that no authenticator here took)."""
    request = context.get("request")
    return bool(request is not None and request.META.get("HTTP_AUTHORIZATION", "").strip())


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if services.store_unreachable(exc):  # a 503 to retry, not a server error
        request = context.get("request")
        metrics.store_error(exc, "api")
        logger.warning(
            "store unreachable",
            extra={
                "event": "store_unreachable",
                "error": exc,
                "view": type(context.get("view")).__name__,
            },
        )
        wrote = request is None or request.method not in SAFE_METHODS
        exc = Unavailable(
            wrote=wrote and getattr(context.get("view"), "store_may_have_written", True)
        )
    if isinstance(exc, RedpackError):
        body, code, headers = answer_parts(exc)
        return Response(body, status=code, headers=headers)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        # An error of no one field (a JSON body that is no object, `[]` or `12`) names the body,
        # where DRF said `non_field_errors`.
        detail = exc.detail if isinstance(exc.detail, dict) else {"body": exc.detail}
        no_field = api_settings.NON_FIELD_ERRORS_KEY
        detail = {("body" if name == no_field else name): said for name, said in detail.items()}
        response.data = error_body("invalid", "the request is not valid", detail)
    elif isinstance(exc, exceptions.APIException):
        # What the refusal names (api/negotiation.py, api/parsers.py, api/auth.py); else a 401
        # of a view that reads credentials from the request names the Authorization header, a
        # body that could not be parsed names the body as a whole, and the header DRF found no
        # parser for its type (its message quoted the header whole); a 405, the method.
        named = tuple(getattr(exc, "fields", ()))
        if not named and isinstance(exc, AUTHENTICATION_REFUSED) and _authenticates(context):
            named = ("Authorization",)
        said_as: Any = exc.detail
        if isinstance(said_as, dict) and isinstance(said_as.get("code"), str):
            # simplejwt's errors carry their code and message in a dict (DetailDictMixin): a
            # deactivated user's token is `user_inactive` here as on the token-only views. Why
            # the token was refused (`Token is expired`) is in its `messages`, when there are.
            said = str(said_as.get("detail", ""))
            why = said_as.get("messages")
            if isinstance(why, list) and why and isinstance(why[0], dict) and "message" in why[0]:
                said = f"{said}: {why[0]['message']}"
            fields = {name: [said] for name in named}
            response.data = error_body(str(said_as["code"]), said, fields)
            return response
        message = str(said_as) if not isinstance(said_as, dict | list) else exc.default_detail
        if isinstance(exc, exceptions.NotAuthenticated) and _sent_credentials(context):
            message = "the Authorization header's scheme is not Bearer: send Bearer <token>"
        codes = exc.get_codes()
        if not named and isinstance(exc, exceptions.ParseError):
            named = ("body",)
        elif not named and isinstance(exc, exceptions.MethodNotAllowed):
            named = ("method",)  # as the web worker names it (webworker.error_answer)
        elif not named and isinstance(exc, exceptions.UnsupportedMediaType):
            named = ("Content-Type",)
            given = str(context["request"].content_type)
            message = f"no body of type {given[:ECHOED]!r} is read here: send application/json"
        response.data = error_body(
            codes if isinstance(codes, str) else exc.default_code,
            str(message),
            {name: [str(message)] for name in named} or None,
        )
    elif isinstance(exc, Http404):
        response.data = error_body("not_found", "not found")
    if response.status_code == status.HTTP_404_NOT_FOUND:
        response.data["error"]["code"] = "not_found"
    return response
