from django.conf import settings
from rest_framework.throttling import ScopedRateThrottle


class RedpackThrottle(ScopedRateThrottle):
    """Per-user rate per scope, counted in Redis (the default django-redis cache).

    Rates are read from settings.REDPACK_THROTTLE_RATES on each request, so the benchmark
    (or a test) can raise them without a restart of the class-level DRF settings cache.
    """

    def get_rate(self) -> str | None:
        return settings.REDPACK_THROTTLE_RATES.get(self.scope or "")
