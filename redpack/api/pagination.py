from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response

MAX_OFFSET = 1_000_000_000


class StrictLimitOffsetPagination(LimitOffsetPagination):
    """limit/offset are validated, not silently ignored: a bad value is a 400 naming it."""

    max_limit = 500

    def _integer(self, request: Request, name: str, low: int, high: int) -> int | None:
        raw = request.query_params.getlist(name)
        if not raw:
            return None
        # ASCII digits only: str.isdigit() takes "²" (which int() refuses) and "５".
        valid = len(raw) == 1 and raw[0].isascii() and raw[0].isdigit() and len(raw[0]) <= 12
        if not valid or not low <= int(raw[0]) <= high:
            raise ValidationError({name: [f"must be one integer between {low} and {high}"]})
        return int(raw[0])

    def get_limit(self, request: Request) -> int | None:
        limit = self._integer(request, self.limit_query_param, 1, self.max_limit)
        return self.default_limit if limit is None else limit

    def get_offset(self, request: Request) -> int:
        return self._integer(request, self.offset_query_param, 0, MAX_OFFSET) or 0

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
            self.offset_query_param: {"minimum": 0, "maximum": MAX_OFFSET},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters


class WalletPagination(StrictLimitOffsetPagination):
    """A page of wallet lines, with the wallet's balance beside it (set by the view)."""

    balance = "0.00"

    def get_paginated_response(self, data: Any) -> Response:
        response = super().get_paginated_response(data)
        response.data = {"balance": self.balance, **response.data}
        return response

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        paginated = super().get_paginated_response_schema(schema)
        paginated["properties"] = {
            "balance": {
                "type": "string",
                "pattern": r"^-?[0-9]+\.[0-9]{2}$",
                "example": "100.00",
                "description": "What the wallet holds now.",
            },
            **paginated["properties"],
        }
        paginated["required"] = ["balance", *paginated.get("required", [])]
        return paginated
