"""One error type for expected failures; the API maps it to HTTP in one exception handler."""

# A request body that ended before its Content-Length: refused by the web worker before the app
# (redpack/webworker.py), and by the app where no such worker serves it (api/middleware.py).
BODY_CUT_SHORT = "the body ended before its Content-Length ({} bytes)"
# A token whose user was deactivated or deleted since it was signed (redpack/bans.py).
USER_BANNED = "this user is deactivated or deleted"


class RedpackError(Exception):
    status = 400
    code = "invalid"
    retry_after: int | None = None  # seconds, sent as Retry-After

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


class OutcomeUnknown(RedpackError):
    """A store's reply was lost and the outcome could not be settled at once: the request may
    or may not have taken effect. The same user's retry converges to the one true answer."""

    status = 503
    code = "outcome_unknown"
    retry_after = 1


class Unavailable(RedpackError):
    """MySQL or Redis could not be reached, or lost the connection, under an API request, not
    in a grab's strategy (which settles or answers OutcomeUnknown itself): retry after
    Retry-After seconds. A request that writes (`wrote`: an unsafe method whose view does not
    say otherwise, api/errors.py) may or may not have taken effect."""

    status = 503
    code = "unavailable"
    retry_after = 1

    def __init__(self, *, wrote: bool) -> None:
        said = "MySQL or Redis did not answer"
        if wrote:
            said += "; the request may or may not have taken effect: look before repeating it"
        super().__init__(f"{said}; try again in a moment")


class InsufficientBalance(RedpackError):
    status = 400
    code = "insufficient_balance"


class RequestRefused(RedpackError):
    """A grab request's own checks failed where its strategy made them (GrabStrategy.
    grab_checked): the user is disabled, or the request is over the user's throttle window
    (`count`: the window's count with it). Nothing was taken; the view answers as its gate
    would have (redpack/api/views.py)."""

    status = 403
    code = "refused"

    def __init__(self, *, disabled: bool, count: int | None = None) -> None:
        super().__init__(USER_BANNED if disabled else "too many grabs")
        self.disabled = disabled
        self.count = count
        self.code = "user_inactive" if disabled else "throttled"


class ChecksNotMade(RedpackError):
    """A strategy that makes a request's checks (GrabStrategy.grab_checked) got no answer to
    them (Redis away, a lost reply): nothing was taken, and the caller makes the checks itself
    (redpack/api/gate.py) before it grabs again."""

    status = 503
    code = "checks_not_made"
    retry_after = 1
