"""The API's JSON parser: DRF's, stricter. A body it cannot take whole is a 400 naming where it
went wrong, never a 500 later and never a silent choice:

- a charset other than UTF-8 or ASCII (RFC 8259: JSON between systems is UTF-8): 400, so that
  what the login throttle reads of a body (api/middleware.py) is what the view reads;
- nested deeper than Python can parse (RecursionError): 400, not a 500;
- a key given twice in one object: 400 (DRF's would keep the last value);
- a lone surrogate (`"\\ud800"`): no text can hold it, and echoing it in an error message fails
  to encode: 400.

Each names the top-level field that holds the fault, or `body` (an object key that cannot be
echoed is never named).
"""

import codecs
import re
from collections.abc import Callable, Iterator
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding  # type: ignore[attr-defined]
from rest_framework.utils import json

_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyError(ParseError):
    """A body that parsed as JSON but cannot be taken: `field` names where (the exception
    handler puts the message under it)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


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


def _where(data: Any, faulty: Callable[[Any], bool]) -> str:
    """The top-level field whose value holds something `faulty`, else `body`."""
    if isinstance(data, dict):
        for key, value in data.items():
            if not _holds_surrogate(key) and any(faulty(item) for item in _walk(value)):
                return str(key)
    return "body"


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        encoding = get_encoding(parser_context or {})
        if codecs.lookup(encoding).name not in {"utf-8", "ascii"}:  # ASCII is UTF-8 too
            raise BodyError(f"JSON is UTF-8, not {encoding}", field="body")
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
