from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from redpack import ratelimit


class RedpackThrottle(BaseThrottle):
    """Per-user rate per scope (`throttle_scope` of the view), counted atomically in Redis
    (redpack/ratelimit.py), failing open to a per-process count while Redis is away.

    Rates are read from settings.REDPACK_THROTTLE_RATES on each request, so the benchmark
    (or a test) can change them without a restart; None turns a scope off.
    """

    def allow_request(self, request: Request, view: APIView) -> bool:
        scope = getattr(view, "throttle_scope", None) or ""
        rate = settings.REDPACK_THROTTLE_RATES.get(scope)
        self.retry_after: float | None = None
        if not rate:
            return True
        who = str(request.user.pk) if request.user and request.user.is_authenticated else None
        if who is None:
            who = f"ip:{self.get_ident(request)}"
        self.retry_after = ratelimit.hit(scope, who, ratelimit.Rate.parse(rate))
        return self.retry_after is None

    def wait(self) -> float | None:
        return self.retry_after
