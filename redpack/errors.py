"""One error type for expected failures; the API maps it to HTTP in one exception handler."""


class RedpackError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(RedpackError):
    status = 404
    code = "not_found"


class InvalidInput(RedpackError):
    status = 400
    code = "invalid"


class Forbidden(RedpackError):
    status = 403
    code = "permission_denied"
