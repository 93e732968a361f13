"""DRF's content negotiation, with its refusals naming what they refuse (api/errors.py's
`fields`): a `?format=` that no renderer of the view has is a 406 naming `format` (DRF answers a
404, as if the path served nothing), and an Accept header that none satisfies a 406 naming
`Accept`, and `format` too when one was asked for (the two then ask for different things). Each
lists what the path answers in (in the format asked for)."""

import re
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


# A weight as RFC 9110 12.4.2 writes it: 0 to 1, at most three decimals.
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")


def _ranges(accept: str) -> dict[str, float]:
    """The media ranges of an Accept header, each with its weight (1 when it gives none, or one
    RFC 9110 12.4.2 does not write, `q=-1` or `q=nan`; a range given twice, its first); a range
    with a parameter of its own (`application/json;version=2`) is left out: it matches no type
    this server answers in, which carry none (12.5.1)."""
    ranges: dict[str, float] = {}
    for item in accept.split(","):
        media_range, *parameters = (part.strip().lower() for part in item.split(";"))
        weight, own = 1.0, False
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip() != "q":
                own = True
            elif _QVALUE.fullmatch(value.strip()):
                weight = float(value)
        if not own:
            ranges.setdefault(media_range, weight)
    return ranges


def _weight(media_type: str, ranges: dict[str, float]) -> float:
    """The weight Accept's `ranges` give `media_type`: the most specific range's that matches
    it (RFC 9110 12.5.1), 0 when none does."""
    kind = media_type.split(";")[0].strip().lower()
    family = kind.partition("/")[0] + "/*"
    for media_range in (kind, family, "*/*"):
        if media_range in ranges:
            return ranges[media_range]
    return 0.0


def acceptable(request: Request, renderers: list[BaseRenderer]) -> list[BaseRenderer]:
    """`renderers` less those whose type the request's Accept weighs 0 (`application/json;q=0`:
    not acceptable, which DRF, reading no weights, took as asked for); all of them when no
    range is weighed 0, as DRF chooses."""
    accept = request.META.get("HTTP_ACCEPT", "")
    if "q=0" not in accept.replace(" ", "").lower():
        return renderers
    ranges = _ranges(accept)
    if all(weight > 0 for weight in ranges.values()):
        return renderers
    return [renderer for renderer in renderers if _weight(renderer.media_type, ranges) > 0]


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
            return super().select_renderer(request, acceptable(request, offered), format_suffix)
        except exceptions.NotAcceptable as refused:
            cause = refused
        # Worked out on a refusal alone (a grab's answer is negotiated on every request).
        parameter = str(self.settings.URL_FORMAT_OVERRIDE)
        format = format_suffix or request.query_params.get(parameter)
        if isinstance(cause, NotAcceptable) and not any(r.format == format for r in offered):
            raise cause  # the format's own: no renderer gives it (else Accept weighed it 0)
        fields: tuple[str, ...] = ("Accept",)
        if format:  # what the format leaves (filter_renderers kept at least one)
            offered = [renderer for renderer in offered if renderer.format == format]
            fields = ("Accept", parameter)
        types = ", ".join(dict.fromkeys(str(renderer.media_type) for renderer in offered))
        raise NotAcceptable(
            f"no answer of a type the Accept header takes; this path answers in: {types}",
            fields=fields,
        ) from cause
