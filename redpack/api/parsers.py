"""The API's JSON parser: DRF's, stricter. A body it cannot take whole is a 400 naming where it
went wrong, never a 500 later and never a silent choice:

- nested deeper than Python can parse (RecursionError): 400, not a 500;
- a key given twice in one object: 400 naming the key (DRF's would keep the last value);
- a lone surrogate (`"\\ud800"`): no text can hold it, and echoing it in an error message fails
  to encode; 400 naming the top-level field that holds it.
"""

import codecs
import re
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


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} given more than once")
        self.key = key


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


def _holds_surrogate(value: Any) -> bool:
    """Whether any string in `value` (keys included) holds a lone surrogate; iterative, so a
    deep document the parser took cannot overflow the stack here."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        encoding = get_encoding(parser_context or {})
        try:
            data = json.load(
                codecs.getreader(encoding)(stream),  # type: ignore[arg-type]
                parse_constant=json.strict_constant,
                object_pairs_hook=_one_value_per_key,
            )
        except _DuplicateKey as exc:
            raise BodyError(str(exc), field=exc.key) from exc
        except RecursionError as exc:
            raise ParseError("JSON parse error - nested too deeply") from exc
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        if _holds_surrogate(data):
            where = "body"
            if isinstance(data, dict):
                where = next(
                    (k for k, v in data.items() if _holds_surrogate(k) or _holds_surrogate(v)),
                    "body",
                )
                if _holds_surrogate(where):
                    where = "body"  # a key that cannot be echoed is not named
            raise BodyError("text holds a lone surrogate (not valid Unicode)", field=where)
        return data
