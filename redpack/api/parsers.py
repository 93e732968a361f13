"""The API's JSON parser: DRF's, stricter. A body it cannot take whole is a 400 naming where it
went wrong, never a 500 later and never a silent choice:

- a charset other than UTF-8 or ASCII (RFC 8259: JSON between systems is UTF-8): 400, so that
  what the login throttle reads of a body (api/middleware.py) is what the view reads;
- nested deeper than Python can parse (RecursionError): 400, not a 500;
- a key given twice in one object: 400 (DRF's would keep the last value);
- a lone surrogate (`"\\ud800"`): no text can hold it, and echoing it in an error message fails
  to encode: 400.

Each names the top-level field that holds the fault, or `body` (an object key that cannot be
echoed is never named). The form and multipart parsers here (DRF's, subclassed) are as strict
about a field given twice (a 400 naming it: Django's QueryDict would hand the view the last
value). Every body
is refused 415 naming `Content-Encoding` when it declares a coding (gzip...): none is decoded
here, and a body read as identity that says otherwise would be taken for what it is not.
"""

import codecs
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import (  # type: ignore[attr-defined]
    FormParser,
    JSONParser,
    MultiPartParser,
    get_encoding,
)
from rest_framework.utils import json

from .errors import ECHOED

_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyError(ParseError):
    """A body that parsed but cannot be taken: `field` names where (the exception handler puts
    the message under its `fields`); a name longer than errors.ECHOED is not echoed: `body`."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.fields = (field if len(field) <= ECHOED else "body",)


def _walk(value: Any) -> Iterator[Any]:
    """`value` and everything in it (object keys included), iteratively: a deep document the
    parser took cannot overflow the stack here."""
    stack = [value]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _holds_surrogate(value: Any) -> bool:
    return any(isinstance(item, str) and _SURROGATE.search(item) for item in _walk(value))


def _repeated(keys: list[str]) -> str:
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    raise ValueError("no key is repeated")


class CodedBody(UnsupportedMediaType):
    """415: the body declares a Content-Encoding, which no parser here decodes."""

    fields = ("Content-Encoding",)

    def __init__(self, coding: str) -> None:
        super().__init__(
            coding,
            detail=f"a body in Content-Encoding {coding[:ECHOED]!r} is not read here: send it "
            "as is",
        )


def _plain_body(parser_context: Any) -> None:
    """CodedBody unless the request's body is in no coding (or `identity`)."""
    request = (parser_context or {}).get("request")
    coding = "" if request is None else request.META.get("HTTP_CONTENT_ENCODING", "")
    if coding.strip().lower() not in ("", "identity"):
        raise CodedBody(coding)


def _one_value_per_field(fields: Any, files: Any = None) -> None:
    """BodyError naming the first field of a form (a QueryDict, with a multipart body's files
    beside it) that was given more than once, as a value or a file or both (DRF hands the view
    both as one: the file)."""
    for name, values in fields.lists():
        if len(values) > 1 or (files is not None and name in files):
            raise BodyError("a field is given more than once", field=str(name))
    for name, values in files.lists() if files is not None else ():
        if len(values) > 1:
            raise BodyError("a field is given more than once", field=str(name))


def _where(data: Any, faulty: Callable[[Any], bool]) -> str:
    """The top-level field whose value holds something `faulty`, else `body`."""
    if isinstance(data, dict):
        for key, value in data.items():
            if not _holds_surrogate(key) and any(faulty(item) for item in _walk(value)):
                return str(key)
    return "body"


def _integer(digits: str) -> int:
    """A JSON integer, refused with a message of this server's when it is longer than Python
    reads (its own ValueError advised the server's sys.set_int_max_str_digits())."""
    length, most = len(digits.lstrip("-")), sys.get_int_max_str_digits()
    if 0 < most < length:
        raise ValueError(f"a number of {length} digits: at most {most} are read")
    return int(digits)


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        _plain_body(parser_context)
        request = (parser_context or {}).get("request")
        # The charset as declared: Django drops one it does not know (`charset=bogus`, an empty
        # one), and the body would then be read as UTF-8 although it says otherwise.
        declared = None if request is None else request.content_params.get("charset")
        encoding = get_encoding(parser_context or {}) if declared is None else declared
        try:
            known = codecs.lookup(encoding).name
        except LookupError:
            known = None
        if known not in {"utf-8", "ascii"}:  # ASCII is UTF-8 too
            raise BodyError(f"JSON is UTF-8, not {encoding[:ECHOED]!r}", field="body")
        twice: list[tuple[dict[str, Any], str]] = []  # (an object, a key it was given twice)

        def one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            found = dict(pairs)
            if len(found) != len(pairs):
                twice.append((found, _repeated([key for key, _ in pairs])))
            return found

        try:
            data = json.load(
                codecs.getreader(encoding)(stream),  # type: ignore[arg-type]
                parse_constant=json.strict_constant if self.strict else None,
                parse_int=_integer,
                object_pairs_hook=one_value_per_key,
            )
        except RecursionError as exc:
            raise ParseError("JSON parse error - nested too deeply") from exc
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        if twice:
            obj, key = twice[0]
            if obj is data and not _holds_surrogate(key):
                field = key
            else:
                field = _where(data, lambda item: item is obj)
            raise BodyError("an object gives a key more than once", field=field)
        if _holds_surrogate(data):
            raise BodyError(
                "text holds a lone surrogate (not valid Unicode)",
                field=_where(
                    data, lambda item: isinstance(item, str) and bool(_SURROGATE.search(item))
                ),
            )
        return data


class StrictFormParser(FormParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        _plain_body(parser_context)
        data = super().parse(stream, media_type, parser_context)
        _one_value_per_field(data)
        return data


class StrictMultiPartParser(MultiPartParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        _plain_body(parser_context)
        parsed = super().parse(stream, media_type, parser_context)
        _one_value_per_field(parsed.data, parsed.files)
        return parsed
