"""DRF's content negotiation, with its refusals naming what they refuse (api/errors.py's
`fields`): a `?format=` that no renderer of the view has is a 406 naming `format` (DRF answers a
404, as if the path served nothing), and an Accept header that none satisfies a 406 naming
`Accept`. Each lists what the path answers in."""

from collections.abc import Iterable
from typing import Any

from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

ECHOED = 40  # characters of an unknown format named back in the refusal, at most


class NotAcceptable(exceptions.NotAcceptable):
    """406, naming the query parameter or header that asked for what no renderer gives."""

    def __init__(self, detail: str, *, field: str) -> None:
        super().__init__(detail)
        self.field = field


class Negotiation(DefaultContentNegotiation):
    def filter_renderers(
        self, renderers: Iterable[BaseRenderer], format: str
    ) -> list[BaseRenderer]:
        offered = list(renderers)
        found = [renderer for renderer in offered if renderer.format == format]
        if not found:
            formats = ", ".join(dict.fromkeys(str(renderer.format) for renderer in offered))
            raise NotAcceptable(
                f"no answer in format {format[:ECHOED]!r} here; this path answers in: {formats}",
                field=str(self.settings.URL_FORMAT_OVERRIDE),
            )
        return found

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> Any:
        offered = list(renderers)
        try:
            return super().select_renderer(request, offered, format_suffix)
        except NotAcceptable:
            raise
        except exceptions.NotAcceptable as refused:
            types = ", ".join(dict.fromkeys(str(renderer.media_type) for renderer in offered))
            raise NotAcceptable(
                f"no answer of a type the Accept header takes; this path answers in: {types}",
                field="Accept",
            ) from refused
