"""Token authentication without a store (bans: redpack/api/gate.py), and a refresh that refuses
a deleted user."""

from typing import Any

from django.contrib.auth import get_user_model
from rest_framework.exceptions import AuthenticationFailed
from rest_framework_simplejwt.authentication import JWTStatelessUserAuthentication
from rest_framework_simplejwt.serializers import TokenRefreshSerializer


class TokenUserAuthentication(JWTStatelessUserAuthentication):
    """The signed token's user, checked by its signature alone (no store asked). The views that
    use it check bans themselves, in their one Redis round trip (redpack/api/gate.py) or in their
    strategy's (strategies/request_checks.py)."""


class RefreshSerializer(TokenRefreshSerializer):
    """simplejwt's refresh, which already refuses an inactive user; a deleted one too."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, str]:
        try:
            return super().validate(attrs)
        except get_user_model().DoesNotExist as exc:
            raise AuthenticationFailed(
                self.error_messages["no_active_account"], "no_active_account"
            ) from exc
