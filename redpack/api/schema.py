"""OpenAPI: drf-spectacular extensions (imported from RedpackConfig.ready) and AutoSchema."""

from typing import Any

from drf_spectacular.authentication import SessionScheme
from drf_spectacular.contrib.rest_framework_simplejwt import SimpleJWTScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import Direction, OpenApiResponse

from .serializers import ErrorSerializer


class StatelessJWTScheme(OpenApiAuthenticationExtension):
    """The grab endpoint's token auth: the same bearer token, verified without a user lookup."""

    target_class = "redpack.api.auth.TokenUserAuthentication"
    match_subclasses = True
    name = "jwtStatelessAuth"
    priority = 1  # wins over the contrib scheme, which reuses the name "jwtAuth"

    def get_security_definition(self, auto_schema):  # type: ignore[no-untyped-def]
        return {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}


class UserJWTScheme(SimpleJWTScheme):
    """simplejwt's own scheme ("jwtAuth") for its subclass that checks the user id claim."""

    target_class = "redpack.api.auth.UserJWTAuthentication"


class CookieScheme(SessionScheme):
    """drf-spectacular's session scheme ("cookieAuth") for its subclass whose CSRF refusal
    names what failed."""

    target_class = "redpack.api.auth.SessionAuthentication"


ERROR_STATUSES = {
    "400": "Invalid input; `fields` names each bad field.",
    "401": "Missing, expired or forged credentials; `fields` names where they were read.",
    "403": "Authenticated, but not allowed; a CSRF refusal's `fields` names what failed.",
    "404": "No such object.",
    "405": "Method not allowed.",
    "406": "No answer in the asked `format` or `Accept` type; `fields` names which.",
    "411": "A body sent without its Content-Length (chunked): send its length.",
    "413": "Request body too large.",
    "415": "A body of a type no parser reads, or in a `Content-Encoding`; `fields` names which.",
    "429": "Too many requests; see the Retry-After header.",
}


class RedpackAutoSchema(AutoSchema):
    """Every operation documents the one JSON error shape for each 4xx it can answer."""

    def _get_response_bodies(self, direction: Direction = "response") -> dict:
        responses = super()._get_response_bodies(direction)
        for code, description in ERROR_STATUSES.items():
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description), code, direction=direction
                )
        return responses


def no_null_characters(result: dict, **kwargs: object) -> dict:
    """DRF's CharField refuses NUL characters and trims blanks: the request schemas say so."""

    def visit(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "string" and not {"pattern", "enum", "format"} & node.keys():
                # Blank-after-trim is refused too where a value is required (minLength 1).
                node["pattern"] = (
                    "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"
                    if node.get("minLength", 0) >= 1
                    else "^[^\\u0000]*$"
                )
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request"):
            visit(component)
    return result


def slash_paths_only(endpoints: list[tuple[Any, ...]], **kwargs: object) -> list[tuple[Any, ...]]:
    """Each route once in the schema, as its name gives it: an alias api/urls.py answers as well
    (a path whose form with the trailing slash is routed too) is left out."""
    routed = {(endpoint[0], endpoint[2]) for endpoint in endpoints}  # (path, method)
    return [e for e in endpoints if (e[0] + "/", e[2]) not in routed]
