"""What every page shows about the run: the embedded-mode ribbon (settings.REDPACK_EMBEDDED)."""

from django.conf import settings
from django.http import HttpRequest


def run_mode(request: HttpRequest) -> dict[str, str]:
    return {"redpack_embedded": settings.REDPACK_EMBEDDED}
