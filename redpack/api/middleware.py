import functools
import io
import re
import unicodedata
from collections.abc import Callable
from types import SimpleNamespace

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.db import DatabaseError
from django.http import (
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
    UnreadablePostError,
)
from django.urls import get_script_prefix, reverse
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.settings import api_settings

from redpack import logs, ratelimit
from redpack.errors import BODY_CUT_SHORT

from .errors import error_body
from .urls import slashless

# The hot endpoints authenticate by token alone (no session, no cookie, no CSRF: a bearer token
# is not sent by a browser on its own): the browser's middleware is skipped for them.
# Each with its slash or without (api/urls.py `route`); matched whole (`fullmatch`).
TOKEN_ONLY_PATHS = re.compile(r"/api/(ping|activities/[0-9]+/grab)/?")


def browser_only(middleware: type) -> type:
    """`middleware` (a subclass, so Django's checks still find it), skipped for requests to
    TOKEN_ONLY_PATHS."""

    class BrowserOnly(middleware):  # type: ignore[misc,valid-type]
        def __call__(self, request: HttpRequest) -> HttpResponse:
            if TOKEN_ONLY_PATHS.fullmatch(request.path_info):
                return self.get_response(request)  # type: ignore[no-any-return]
            return super().__call__(request)  # type: ignore[no-any-return]

    BrowserOnly.__name__ = BrowserOnly.__qualname__ = f"BrowserOnly{middleware.__name__}"
    return BrowserOnly


BrowserSessionMiddleware = browser_only(SessionMiddleware)
BrowserAuthenticationMiddleware = browser_only(AuthenticationMiddleware)
BrowserMessageMiddleware = browser_only(MessageMiddleware)


class AnswerFramingMiddleware:
    """Every answer with a body says its length, and an answer to HEAD has the status and
    headers a GET would get (its Content-Length too) and no body (RFC 9110 9.3.2). First in
    MIDDLEWARE, so that it sees every answer last.

    Django's CommonMiddleware adds the length, but not to an answer made before it or instead
    of it (a request refused by a middleware, or by Django for its Host): those went out
    chunked, and a client speaking HTTP/1.0 read them to the connection's end. A body sent to
    HEAD was read by a client that keeps its connection as the start of its next answer (curl:
    "excess found"; Python's clients: a bad status line): Django and gunicorn both leave
    dropping it to the app. 204 and 304 carry no length (RFC 9110 8.6)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if isinstance(response, StreamingHttpResponse):
            if request.method == "HEAD":
                response.streaming_content = []
            return response
        if response.status_code not in (204, 304) and not response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))
        if request.method == "HEAD":
            response.content = b""
        return response


class RequestIdMiddleware:
    """Every request has an id: the caller's X-Request-ID (when it looks like one) or a new
    one. Log lines written meanwhile carry it, so do the Celery tasks enqueued meanwhile
    (redpack/logs.py), and the response says it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        current = logs.request_id_from(request.headers.get(logs.REQUEST_ID_HEADER))
        token = logs.request_id.set(current)
        try:
            response = self.get_response(request)
        finally:
            logs.request_id.reset(token)
        response[logs.REQUEST_ID_HEADER] = current
        return response


# Every method some view of this server answers: what `OPTIONS *` hears (RFC 9110 9.3.7).
SERVER_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"


class RequestTargetMiddleware:
    """A request target that is not a path (RFC 9112 3.2), as the web server passed it on
    (RAW_URI): `OPTIONS *` asks what the server as a whole allows and hears it (204, Allow);
    `*` with another method, or a bare authority (`CONNECT host:443`: this server is no proxy),
    is refused in the API's JSON shape; an absolute URL's own host is the request's host, as
    RFC 9112 3.2.2 asks (the Host header is ignored), and Django checks it against
    ALLOWED_HOSTS (where it was served under the Host header whatever the URL named); an
    absolute URL with a fragment, which RFC 9112's absolute-form does not have, is refused
    naming the target (`http://a#@b/` names host a, and was served as b's), and so is one with
    userinfo (RFC 9110 4.2.4: an error; `http://a@b/` was served as b's, as a Host header of
    that form is refused). Before, each got Django's HTML 404, or an answer for another host.
    A path costs one look (gunicorn drops a path's fragment)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        target = request.META.get("RAW_URI")
        if not target or target[0] == "/":
            return self.get_response(request)
        if target == "*":
            if request.method == "OPTIONS":
                allowed = HttpResponse(status=204, headers={"Allow": SERVER_METHODS})
                del allowed["Content-Type"]
                return allowed
            return _refused(400, "bad_request", "the request target * is for OPTIONS only")
        scheme, sep, rest = target.partition("://")
        if sep and scheme.lower() in ("http", "https"):
            if "#" in rest:  # an absolute-URI has no fragment (RFC 9112 3.2.2)
                return _refused(400, "bad_request", "a request target has no fragment (#)")
            authority = re.split("[/?]", rest, maxsplit=1)[0]
            if "@" in authority:  # RFC 9110 4.2.4: userinfo is an error in an http URI
                return _refused(400, "bad_request", "a request target names no user (@)")
            request.META["HTTP_HOST"] = authority
            return self.get_response(request)
        if request.method == "CONNECT":
            return _refused(405, "method_not_allowed", "CONNECT: this server is not a proxy")
        return _refused(400, "bad_request", "the request target must be a path or an http URL")


def _refused(status: int, code: str, message: str) -> JsonResponse:
    """RequestTargetMiddleware's refusal, naming the request target (405: the method, with
    Allow)."""
    fields = {"method" if status == 405 else "target": [message]}
    answer = JsonResponse(error_body(code, message, fields), status=status)
    if status == 405:
        answer["Allow"] = SERVER_METHODS
    return answer


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class RequestSizeLimitMiddleware:
    """413 for a declared body above DATA_UPLOAD_MAX_MEMORY_SIZE, before anything reads it.

    A body sent without a Content-Length (`Transfer-Encoding`) is one Django would not read at
    all (it reads Content-Length bytes): a request that could carry a body the view reads (POST,
    PUT, PATCH) is answered 411, naming the header, rather than as if it had no body;
    not the grab and the ping, which read none. Reading such a body here instead would hold a
    thread for as long as a client takes to send it, before any authentication: a proxy in front
    (deploy/nginx.conf) reads chunked bodies and passes them on with their length.

    A body that ends before its Content-Length (the client closed its side early) is 400 naming
    the header, before any view: read as it came, it would be taken for a whole request (a send
    cut short after its first fields would move money). The server reads no more than the
    declared length, so a body longer than it is not this request's.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse(error_body("bad_request", "invalid Content-Length"), status=400)
        # A body a view may read (asked only of a request that sends one): not the grab's or the
        # ping's, which read none.
        reads_body = (
            bool(length or "HTTP_TRANSFER_ENCODING" in request.META)
            and request.method in BODY_METHODS
            and not TOKEN_ONLY_PATHS.fullmatch(request.path_info)
        )
        if reads_body and not length:
            message = "a request body needs a Content-Length (a chunked body is not read)"
            body = error_body("length_required", message, {"Content-Length": [message]})
            return JsonResponse(body, status=411)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and length > limit:
            message = f"request body over {limit} bytes"
            body = error_body("too_large", message, {"Content-Length": [message]})
            return JsonResponse(body, status=413)
        if reads_body and length and not _whole_body(request, length):
            message = BODY_CUT_SHORT.format(length)
            body = error_body("bad_request", message, {"Content-Length": [message]})
            return JsonResponse(body, status=400)
        return self.get_response(request)


def _whole_body(request: HttpRequest, length: int) -> bool:
    """Whether the request's body arrived in full (read here: the views read it from memory)."""
    try:
        return len(request.body) == length
    except UnreadablePostError:  # the connection failed mid-body
        return False


class CredentialThrottleMiddleware:
    """Password guessing meets a limit: POSTs to the token endpoints and the admin login are
    counted per client IP and per account a name reaches (REDPACK_LOGIN_RATES; `_account_of`),
    atomically in Redis (redpack/ratelimit.py), and answered 429 with Retry-After beyond it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        # Once, as the server loads (each worker builds its middleware before its first
        # request): reversed on first use instead, by every thread of a burst's first POSTs at
        # once, it took about a tenth of the CPU of a fresh server's first 15 s of grabs.
        _credential_paths(get_script_prefix())

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and _is_credential_path(request.path):
            wait = _credential_wait(request)
            if wait is not None:
                return _too_many(request, wait)
        return self.get_response(request)


def _is_credential_path(path: str) -> bool:
    return path in _credential_paths(get_script_prefix())


@functools.lru_cache(maxsize=8)
def _credential_paths(script_prefix: str) -> frozenset[str]:
    """The login paths under a script prefix, reversed once (every POST asks, grabs included),
    each with and without its trailing slash (the API answers both: api/urls.py). A few
    prefixes at most: a trusted proxy's SCRIPT_NAME header names one per request, and a cache
    without a bound held every one sent (a client on this host sent thousands)."""
    paths = [reverse(name) for name in ("token-obtain", "token-refresh", "admin:login")]
    return frozenset(paths + [slashless(path) for path in paths])


def _credential_wait(request: HttpRequest) -> float | None:
    rates: dict[str, str | None] = settings.REDPACK_LOGIN_RATES
    per_ip, per_username = rates.get("ip"), rates.get("username")
    waits = []
    if per_ip:
        address = request.META.get("REMOTE_ADDR", "")
        waits.append(ratelimit.hit("login-ip", address, ratelimit.Rate.parse(per_ip)))
    admin = not request.path_info.startswith("/api/")  # else the API's token paths
    username = _username(request, admin=admin)
    if per_username and username and username.strip():
        # The admin's form logs in the name's NFKC form (Django's UsernameField); the API, the
        # name as given.
        who = _account_of(unicodedata.normalize("NFKC", username) if admin else username)
        waits.append(ratelimit.hit("login-user", who, ratelimit.Rate.parse(per_username)))
    blocked = [wait for wait in waits if wait is not None]
    return max(blocked) if blocked else None


USERNAME_MAX = 150  # auth_user.username


def _username(request: HttpRequest, *, admin: bool) -> str | None:
    """The username a login names, as its view will read it (a refresh names none): the admin's
    form from the form body; the API's from the body as DRF parses it, with the parser DRF picks
    for the declared type (JSON under `*/*`, a form under `*/x-www-form-urlencoded`...), a
    number as its text (DRF's CharField)."""
    if admin:
        return request.POST.get("username") or None
    content_type = request.META.get("CONTENT_TYPE", "")
    parsers = [parser() for parser in api_settings.DEFAULT_PARSER_CLASSES]  # type: ignore[operator]
    negotiation = DefaultContentNegotiation()
    asked = SimpleNamespace(content_type=content_type)
    parser = negotiation.select_parser(asked, parsers)  # type: ignore[arg-type]
    if parser is None:
        return None  # the view answers 415
    context = {"request": request, "encoding": request.encoding or settings.DEFAULT_CHARSET}
    try:
        data = parser.parse(io.BytesIO(request.body), content_type, context)
    except Exception:  # noqa: BLE001 - whatever the view's parser refuses, the view answers
        return None
    data = getattr(data, "data", data)  # a multipart body: its fields (DataAndFiles)
    name = data.get("username") if hasattr(data, "get") else None
    if isinstance(name, bool) or not isinstance(name, str | int | float):
        return None
    return str(name)


def _account_of(username: str) -> str:
    """What a login's attempts are counted against: the account the name reaches, or, naming
    none, the name folded (trimmed, compatibility forms, case, accents and invisible characters
    dropped). The database matches names as its collation does: on MariaDB `Alice `, `alice`,
    its fullwidth form and one with a zero-width space inside are one account, which counting
    each spelling apart would give each its own limit. `username` as the login view takes it;
    both trim it."""
    name = username.strip()
    try:
        # No login view takes a NUL. A name of any length is looked up: the database's
        # collation ignores some characters, however many there are.
        if "\x00" not in name:
            name.encode("utf-8")  # a lone surrogate reaches no account
            field = get_user_model().USERNAME_FIELD
            account = (
                get_user_model()
                ._default_manager.filter(**{field: name})
                .order_by("pk")
                .values_list("pk", flat=True)
                .first()
            )
            if account is not None:
                return f"id:{account}"
    except (UnicodeEncodeError, DatabaseError):
        pass
    folded = unicodedata.normalize("NFKD", name).casefold()
    kept = (
        c
        for c in folded
        if not unicodedata.combining(c) and unicodedata.category(c) not in ("Cf", "Cc")
    )
    kept_name = "".join(kept)[:USERNAME_MAX]
    # Redis takes text: a lone surrogate is escaped.
    return "name:" + kept_name.encode("utf-8", "backslashreplace").decode("utf-8")


def _too_many(request: HttpRequest, wait: float) -> HttpResponse:
    message = "too many login attempts; try again later"
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse(error_body("throttled", message), status=429)
    else:
        response = HttpResponse(message, status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(int(wait))
    return response
