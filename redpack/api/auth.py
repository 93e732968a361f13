"""Token authentication without a store (bans: redpack/api/gate.py), and a refresh that refuses
a deleted user. Every token's user id claim is checked to be one (`user_id_claim`) before it is
used: a token signed with the server's key but naming no possible user is a 401, not a 500
(and a `1.5` is not user 1). Each refusal names what it refused (api/errors.py's `fields`): a
401 of a view reading the Authorization header names it, the token views' 401 the body's fields
they judged (api/views.py's `FieldsNamed`), a CSRF refusal the cookie, field or header that failed
(`SessionAuthentication`)."""

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.http.request import HttpHeaders
from rest_framework import authentication
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.request import Request
from rest_framework_simplejwt.authentication import (
    JWTAuthentication,
    JWTStatelessUserAuthentication,
)
from rest_framework_simplejwt.exceptions import InvalidToken, TokenError
from rest_framework_simplejwt.serializers import TokenRefreshSerializer
from rest_framework_simplejwt.settings import api_settings
from rest_framework_simplejwt.tokens import AccessToken, RefreshToken, Token

# auth_user.id is a signed 32-bit integer: a claim beyond it names nobody.
MAX_USER_ID = 2**31 - 1


def user_id_claim(token: Token) -> int:
    """The token's user id: an integer, or the decimal string of one as simplejwt writes it,
    from 1 to MAX_USER_ID; InvalidToken (401 `token_not_valid`) for anything else."""
    claim = token.payload.get(api_settings.USER_ID_CLAIM)
    if isinstance(claim, str) and claim.isascii() and claim.isdigit() and len(claim) <= 10:
        claim = int(claim)
    if isinstance(claim, bool) or not isinstance(claim, int) or not 1 <= claim <= MAX_USER_ID:
        raise InvalidToken("the token's user id is not a user id")
    return claim


class DatedClaims:
    """simplejwt's expiry check, for a time a datetime can hold: a signed `exp` of 10**30 or
    1e308 is TokenError (the view's 401 `token_not_valid`), not an OverflowError (500)."""

    def check_exp(self, claim: str = "exp", current_time: Any = None) -> None:
        try:
            super().check_exp(claim, current_time)  # type: ignore[misc]
        except (OverflowError, OSError, ValueError, TypeError) as exc:
            raise TokenError(f"the token's '{claim}' claim is not a time") from exc


class CheckedAccessToken(DatedClaims, AccessToken):
    """The access token every view reads (SIMPLE_JWT's AUTH_TOKEN_CLASSES)."""


class CheckedRefreshToken(DatedClaims, RefreshToken):  # type: ignore[misc]
    """The refresh token the refresh reads; the access token it gives is checked the same."""

    access_token_class = CheckedAccessToken


class CheckedUserId:
    """simplejwt's `get_user`, once the token's user id claim is one (`user_id_claim`)."""

    def get_user(self, validated_token: Token) -> Any:
        user_id_claim(validated_token)
        return super().get_user(validated_token)  # type: ignore[misc]


class SchemeInAnyCase:
    """simplejwt's token from the Authorization header, its scheme read in any case (RFC 9110
    11.1: `bearer` and `BEARER` are `Bearer`; simplejwt takes only the case written in
    AUTH_HEADER_TYPES and answered any other 401 "credentials were not provided")."""

    def get_raw_token(self, header: bytes) -> bytes | None:
        parts = header.split(None, 1)
        if parts:
            schemes = {name.lower(): name for name in api_settings.AUTH_HEADER_TYPES}
            known = schemes.get(parts[0].decode("latin-1").lower())
            if known is not None:
                header = b" ".join([known.encode(), *parts[1:]])
        return super().get_raw_token(header)  # type: ignore[misc,no-any-return]


class TokenUserAuthentication(SchemeInAnyCase, CheckedUserId, JWTStatelessUserAuthentication):
    """The signed token's user, checked by its signature alone (no store asked). The views that
    use it check bans themselves, in their one Redis round trip (redpack/api/gate.py) or in their
    strategy's (strategies/request_checks.py)."""


class UserJWTAuthentication(SchemeInAnyCase, CheckedUserId, JWTAuthentication):
    """simplejwt's token authentication with the user read from the database, for the views
    that need the user's row (sending, the admin's API)."""


class RefreshSerializer(TokenRefreshSerializer):
    """simplejwt's refresh, which already refuses an inactive user; a deleted one too."""

    token_class = CheckedRefreshToken

    def validate(self, attrs: dict[str, Any]) -> dict[str, str]:
        user_id_claim(self.token_class(attrs["refresh"]))  # TokenError: the view's 401
        try:
            return super().validate(attrs)
        except get_user_model().DoesNotExist as exc:
            raise AuthenticationFailed(
                self.error_messages["no_active_account"], "no_active_account"
            ) from exc
        except (TypeError, ValueError, OverflowError) as exc:
            # A signed claim the new access token copies but cannot be signed with (an `iss`
            # that is not a string): the token is refused, not a 500.
            raise InvalidToken("the token's claims cannot be carried into a new token") from exc


def csrf_field(reason: str) -> str:
    """Which part of a request Django's CSRF check refused, by the start of its reason
    (django.middleware.csrf's REASON_* and its token messages)."""
    if reason.startswith("CSRF cookie"):
        return str(settings.CSRF_COOKIE_NAME)
    if reason.startswith(("Origin ", "Referer ")):
        return reason.split(" ", 1)[0]
    if reason.startswith("CSRF token from POST"):
        return "csrfmiddlewaretoken"
    return HttpHeaders.parse_header_name(settings.CSRF_HEADER_NAME) or "X-CSRFToken"


class CsrfRefused(PermissionDenied):
    """DRF's CSRF refusal (403), naming what failed (`csrf_field`)."""

    def __init__(self, refused: PermissionDenied) -> None:
        super().__init__(refused.detail)
        self.fields = (csrf_field(str(refused.detail).removeprefix("CSRF Failed: ")),)


class SessionAuthentication(authentication.SessionAuthentication):
    """DRF's, its CSRF refusal naming what failed (`CsrfRefused`)."""

    def enforce_csrf(self, request: Request) -> None:
        try:
            super().enforce_csrf(request)
        except PermissionDenied as exc:
            raise CsrfRefused(exc) from exc
