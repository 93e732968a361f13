"""Token authentication that knows about bans (redpack/bans.py) without a MySQL query."""

from typing import Any

from django.contrib.auth import get_user_model
from rest_framework.exceptions import AuthenticationFailed
from rest_framework_simplejwt.authentication import JWTStatelessUserAuthentication
from rest_framework_simplejwt.serializers import TokenRefreshSerializer
from rest_framework_simplejwt.tokens import Token

from redpack import bans


class ActiveTokenUserAuthentication(JWTStatelessUserAuthentication):
    """The signed token's user, unless deactivated or deleted since the token was issued."""

    def get_user(self, validated_token: Token):  # type: ignore[no-untyped-def]
        user = super().get_user(validated_token)
        if bans.is_disabled(int(user.pk)):
            raise AuthenticationFailed("this user is deactivated", code="user_inactive")
        return user


class RefreshSerializer(TokenRefreshSerializer):
    """simplejwt's refresh, which already refuses an inactive user; a deleted one too."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, str]:
        try:
            return super().validate(attrs)
        except get_user_model().DoesNotExist as exc:
            raise AuthenticationFailed(
                self.error_messages["no_active_account"], "no_active_account"
            ) from exc
