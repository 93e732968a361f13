"""DRF's content negotiation, with its refusals naming what they refuse (api/errors.py's
`fields`): a `?format=` that no renderer of the view has is a 406 naming `format` (DRF answers a
404, as if the path served nothing), and an Accept header that none satisfies a 406 naming
`Accept`, and `format` too when one was asked for (the two then ask for different things). Each
lists what the path answers in (in the format asked for)."""

from collections.abc import Iterable
from typing import Any

from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

from .errors import ECHOED


class NotAcceptable(exceptions.NotAcceptable):
    """406, naming the query parameter or header (or both) that asked for what no renderer
    gives."""

    def __init__(self, detail: str, *, fields: tuple[str, ...]) -> None:
        super().__init__(detail)
        self.fields = fields


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
                fields=(str(self.settings.URL_FORMAT_OVERRIDE),),
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
            parameter = str(self.settings.URL_FORMAT_OVERRIDE)
            format = format_suffix or request.query_params.get(parameter)
            fields: tuple[str, ...] = ("Accept",)
            if format:  # what the format left (filter_renderers kept at least one)
                offered = [renderer for renderer in offered if renderer.format == format]
                fields = ("Accept", parameter)
            types = ", ".join(dict.fromkeys(str(renderer.media_type) for renderer in offered))
            raise NotAcceptable(
                f"no answer of a type the Accept header takes; this path answers in: {types}",
                fields=fields,
            ) from refused
