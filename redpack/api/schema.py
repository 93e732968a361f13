"""OpenAPI: drf-spectacular extensions (imported from RedpackConfig.ready) and AutoSchema."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse

from .serializers import ErrorSerializer


class StatelessJWTScheme(OpenApiAuthenticationExtension):
    """The grab endpoint's token auth: the same bearer token, verified without a user lookup."""

    target_class = "rest_framework_simplejwt.authentication.JWTStatelessUserAuthentication"
    name = "jwtStatelessAuth"
    priority = 1  # wins over the contrib scheme, which reuses the name "jwtAuth"

    def get_security_definition(self, auto_schema):  # type: ignore[no-untyped-def]
        return {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}


ERROR_STATUSES = {
    "400": "Invalid input; `fields` names each bad field.",
    "401": "Missing, expired or forged credentials.",
    "403": "Authenticated, but not allowed.",
    "404": "No such object.",
    "405": "Method not allowed.",
    "406": "Not acceptable.",
    "413": "Request body too large.",
    "415": "Unsupported media type.",
    "429": "Too many requests; see the Retry-After header.",
}


class RedpackAutoSchema(AutoSchema):
    """Every operation documents the one JSON error shape for each 4xx it can answer."""

    def _get_response_bodies(self, direction: str = "response") -> dict:  # type: ignore[override]
        responses = super()._get_response_bodies(direction)
        for code, description in ERROR_STATUSES.items():
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description), code, direction=direction
                )
        return responses
