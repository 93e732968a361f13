"""Thin views: validate with a serializer, call one service, render."""

import functools
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiResponse, extend_schema
from drf_spectacular.views import SCHEMA_KWARGS, SpectacularAPIView, SpectacularSwaggerView
from prometheus_client import CONTENT_TYPE_LATEST
from rest_framework import generics, status
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import AllowAny, IsAdminUser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework_simplejwt.views import TokenObtainPairView, TokenRefreshView

from redpack import exposition, health, selectors, services
from redpack.errors import USER_BANNED, ChecksNotMade, RequestRefused
from redpack.money import from_cents
from strategies import registry
from strategies.base import GrabResult, Outcome

from . import gate
from .auth import SessionAuthentication, TokenUserAuthentication, UserJWTAuthentication
from .errors import error_body, name_fields
from .pagination import WalletPagination
from .serializers import (
    ActivityCreateSerializer,
    ActivityGrabSerializer,
    ActivitySerializer,
    ErrorSerializer,
    GrabDetailSerializer,
    GrabResultSerializer,
    RefundSerializer,
    StrategySerializer,
    WalletLineSerializer,
)
from .throttles import RedpackThrottle


def user_id(request: Request) -> int:
    """The authenticated user's id (every view here requires authentication)."""
    return int(request.user.pk)  # type: ignore[arg-type,union-attr]


class ApiRootView(APIView):
    """Where the API's endpoints are, for anyone (the docs describe each)."""

    permission_classes = [AllowAny]
    authentication_classes: list[type] = []

    @extend_schema(exclude=True)
    def get(self, request: Request) -> Response:
        names = ["docs", "schema", "token-obtain", "token-refresh", "strategies"]
        names += ["activity-create", "my-grabs", "my-refunds", "my-wallet", "ping"]
        endpoints = {name: reverse(name) for name in names}
        return Response({"endpoints": endpoints, "health": reverse("healthz")})


class DocumentRenderedForGet:
    """A view whose document is YAML or HTML (the schema, its UI), public: it reads no token (a
    stale Authorization header a browser or client still sends gets the document, not a 401),
    answers any other method (OPTIONS, and the 405 of POST, PUT...) in JSON like the rest of the
    API, and its errors too (a format it does not render, `?format=json` on the UI): its own
    renderers gave them as text/html or YAML, an OPTIONS as a template that does not exist
    (500)."""

    def get_renderers(self) -> list[BaseRenderer]:
        if self.request.method in ("GET", "HEAD"):  # type: ignore[attr-defined]
            return super().get_renderers()  # type: ignore[misc,no-any-return]
        return [JSONRenderer()]

    def handle_exception(self, exc: Exception) -> Response:
        response: Response = super().handle_exception(exc)  # type: ignore[misc]
        self.request.accepted_renderer = JSONRenderer()  # type: ignore[attr-defined]
        self.request.accepted_media_type = "application/json"  # type: ignore[attr-defined]
        return response


class SchemaView(DocumentRenderedForGet, SpectacularAPIView):
    authentication_classes: list[type] = []  # public (DocumentRenderedForGet)
    # drf-spectacular loads its extensions' classes during a process's first generation, and
    # not safely from many threads at once: of 64 first requests to a new server, up to 61 got
    # a 500. The first generation runs alone; later ones find the classes loaded.
    _first = threading.Lock()
    _generated = False

    @extend_schema(**SCHEMA_KWARGS)  # as drf-spectacular's own: not in the schema
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if not SchemaView._generated:
            with SchemaView._first:
                response: Response = super().get(request, *args, **kwargs)
                SchemaView._generated = True
                return response
        return super().get(request, *args, **kwargs)  # type: ignore[no-any-return]


class DocsView(DocumentRenderedForGet, SpectacularSwaggerView):
    authentication_classes: list[type] = []


class ActivityCreateView(APIView):
    throttle_classes = [RedpackThrottle]
    throttle_scope = "send"

    @extend_schema(
        request=ActivityCreateSerializer,
        responses={201: ActivitySerializer},
    )
    def post(self, request: Request) -> Response:
        serializer = ActivityCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        activity = services.activity_send(
            sender_id=user_id(request),
            total_amount=data["total_amount"],
            total_count=data["total_count"],
            strategy=data["strategy"],
            allocation_kind=data["allocation"],
            expires_in=data["expires_in"],
        )
        return Response(ActivitySerializer(activity).data, status=status.HTTP_201_CREATED)


class ActivityDetailView(APIView):
    @extend_schema(responses={200: ActivitySerializer})
    def get(self, request: Request, pk: int) -> Response:
        return Response(ActivitySerializer(selectors.activity_get(activity_id=pk)).data)


class GatedView(APIView):
    """Token-only views: the token is checked by its signature (no store asked), then one Redis
    round trip (api/gate.py) checks the ban, the view's `gate_scope` throttle and, for a grab,
    the activity's finished flag; unless the view's work makes the same checks in its own round
    trip (`carries_checks`: a grab of a strategy that does, GrabStrategy.carries_checks)."""

    authentication_classes = [TokenUserAuthentication]
    throttle_classes: list[type] = []  # counted by the gate
    gate_scope: str | None = None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authenticates: 401 before any store
        self.carried: gate.Carried | None = None
        self.gate = gate.Gate(None, False, None)
        if self.answered_at_once(request, kwargs):
            return  # nothing to ask (GrabView: the activity's end, from this process's memory)
        if self.carries_checks(kwargs):
            # The strategy makes the same checks with the grab (GrabView.post).
            self.carried = gate.carried(user_id=user_id(request), scope=self.gate_scope)
        else:
            self.check_here(request, kwargs.get("pk"))

    def answered_at_once(self, request: Request, kwargs: dict[str, Any]) -> bool:
        return False

    def check_here(self, request: Request, activity_id: int | None) -> None:
        """The gate's one round trip (api/gate.py); 401 for a disabled user, 429 beyond the
        throttle."""
        self.gate = gate.check(
            user_id=user_id(request), scope=self.gate_scope, activity_id=activity_id
        )
        if self.gate.disabled:
            self.refuse_disabled()
        if self.gate.wait is not None:
            self.throttled(request, self.gate.wait)

    def carries_checks(self, kwargs: dict[str, Any]) -> bool:
        return False

    def refuse_disabled(self) -> NoReturn:
        raise AuthenticationFailed(USER_BANNED, code="user_inactive")


class GrabView(GatedView):
    """A grab costs one Redis round trip before its strategy and no MySQL query of its own; none
    before a strategy that makes the request's checks itself (GrabStrategy.carries_checks: the
    Redis strategies in their grab script, group_commit once per batch), and none at all for an
    activity this process knows has ended (`answered_at_once`)."""

    gate_scope = "grab"
    known: GrabResult | None = None  # the answer from memory (`answered_at_once`)
    # A store that did not answer the strategy is the service's OutcomeUnknown: one that
    # reaches the API's handler (503 `unavailable`) failed the checks before it, nothing taken.
    store_may_have_written = False

    def answered_at_once(self, request: Request, kwargs: dict[str, Any]) -> bool:
        """A grab of an activity this process knows has ended is answered from memory before
        any round trip (services.grab_answered_from_memory; the hot burst's 99 %): the ban from
        this process's copy of the set, no throttle count for an answer that grants nothing
        and costs less than the count. Else a grab of a user whose throttle window this process
        has found over its limit is answered 429 at once (gate.throttled_from_memory). Only for
        a POST: another method is answered 405 after this, and must not count as a grab
        answered."""
        if request.method != "POST":
            return False
        wait = None
        try:
            self.known = services.grab_answered_from_memory(
                activity_id=kwargs["pk"], user_id=user_id(request)
            )
            if self.known is None:
                wait = gate.throttled_from_memory(user_id=user_id(request), scope=self.gate_scope)
        except RequestRefused:  # a disabled user, by this process's copy of the bans
            self.refuse_disabled()
        if wait is not None:
            self.throttled(request, wait)
        return self.known is not None

    def carries_checks(self, kwargs: dict[str, Any]) -> bool:
        return services.grab_carries_checks(activity_id=kwargs["pk"])

    def grab(self, request: Request, pk: int) -> GrabResult:
        if self.known is not None:
            return self.known
        return services.activity_grab(
            activity_id=pk,
            user_id=user_id(request),
            finished_hint=self.gate.finished,
            finished_ttl_ms=self.gate.finished_ttl_ms,
            bounded=True,
            checks=None if self.carried is None else self.carried.checks,
        )

    @extend_schema(
        request=None,
        responses={
            200: OpenApiResponse(
                GrabResultSerializer,
                "An answer: grabbed, already_grabbed (with the amount), sold_out or closed.",
            ),
            409: OpenApiResponse(
                GrabResultSerializer,
                "contended: nothing this time, packets may remain; retry (after Retry-After "
                "seconds when `reason` is `shed`: the activity's line in this server was full; "
                "a shed answer says nothing of an earlier grab, the retry does).",
            ),
            503: OpenApiResponse(
                ErrorSerializer,
                "outcome_unknown: a store's reply was lost and the grab may or may not have "
                "been taken; retry after Retry-After seconds: the same user's retry gets the one "
                "true answer.",
            ),
        },
    )
    def post(self, request: Request, pk: int) -> Response:
        try:
            result = self.grab(request, pk)
        except RequestRefused as refused:  # the checks, made by the strategy
            if self.carried is None:
                raise
            if refused.disabled:
                self.refuse_disabled()
            self.throttled(request, self.carried.wait(refused.count))
        except ChecksNotMade:  # nothing taken: the checks here (with their fallbacks), again
            self.carried = None
            self.check_here(request, pk)
            result = self.grab(request, pk)
        body = {"outcome": result.outcome.value}
        if result.amount_cents is not None:
            body["amount"] = str(from_cents(result.amount_cents))
        if result.outcome is not Outcome.CONTENDED:
            return Response(body)
        headers = {}
        if result.reason is not None:
            body["reason"] = result.reason
            headers["Retry-After"] = str(settings.REDPACK_SHED_RETRY_AFTER)
        return Response(body, status=status.HTTP_409_CONFLICT, headers=headers)


class PingView(GatedView):
    """The web server's ceiling for the bench: an authenticated request that does nothing (the
    token, the ban check's round trip: what a grab request costs before a strategy that does
    not carry its checks), and nothing else (not throttled either: one token drives it as fast
    as the server answers)."""

    @extend_schema(request=None, responses={200: OpenApiResponse(description='`{"pong": true}`')})
    def get(self, request: Request) -> Response:
        return Response({"pong": True})


class ActivityGrabsView(generics.ListAPIView):
    """Who grabbed what: the activity's sender and staff only."""

    serializer_class = ActivityGrabSerializer

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.activity_grabs(
            activity_id=self.kwargs["pk"],
            viewer_id=user_id(self.request),
            viewer_is_staff=bool(self.request.user.is_staff),
        )


class MyGrabsView(generics.ListAPIView):
    serializer_class = GrabDetailSerializer

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.user_grabs(user_id=user_id(self.request))


class MyRefundsView(generics.ListAPIView):
    """What came back to you from the activities you sent."""

    serializer_class = RefundSerializer

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.user_refunds(user_id=user_id(self.request))


class MyWalletView(generics.ListAPIView):
    """Your balance and your wallet's movements, newest first. A grab reaches the balance
    shortly after its answer (the crediting task, redpack/ledger.py); during a burst of grabs,
    within about REDPACK_CREDIT_MAX_WAIT seconds (30 by default, redpack/credit_pace.py)."""

    serializer_class = WalletLineSerializer
    pagination_class = WalletPagination

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.wallet_lines(user_id=user_id(self.request))

    def paginate_queryset(self, queryset):  # type: ignore[no-untyped-def]
        page = super().paginate_queryset(queryset)
        self.paginator.balance = str(selectors.wallet_balance(user_id=user_id(self.request)))  # type: ignore[union-attr]
        return page


class StrategyListView(APIView):
    @extend_schema(responses={200: StrategySerializer(many=True)})
    def get(self, request: Request) -> Response:
        rows = []
        for name in registry.names():
            strategy = registry.get(name)
            rows.append(
                {
                    "name": name,
                    "label": strategy.label,
                    "tradeoff": strategy.tradeoff,
                    "safe": strategy.safe,
                    "allowed": registry.allowed(name),
                    "unavailable_reason": registry.unavailable_reason(name),
                }
            )
        return Response(StrategySerializer(rows, many=True).data)


def read_only(view: Callable[[HttpRequest], HttpResponse]) -> Callable[..., HttpResponse]:
    """A plain view that only reads (GET, HEAD): any other method is 405 in JSON, with Allow,
    and no CSRF check first (it changes nothing; the check would answer a POST with an HTML
    403)."""

    @functools.wraps(view)
    def only_reading(request: HttpRequest) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            message = f'method "{request.method}" not allowed'
            body = error_body("method_not_allowed", message, {"method": [message]})
            return JsonResponse(body, status=405, headers={"Allow": "GET, HEAD"})
        return view(request)

    return csrf_exempt(only_reading)


@read_only
def healthz(request: HttpRequest) -> JsonResponse:
    """`ok`, `degraded` or `down`, for anyone (load balancers, probes): cheap and cached, no
    details (redpack/health.py). 503 when the database or Redis is down; `degraded` (still 200)
    when only the broker or the worker is."""
    status_text, code = health.verdict()
    return JsonResponse({"status": status_text}, status=code)


@read_only
def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus document of this server (redpack/exposition.py): for loopback addresses,
    REDPACK_METRICS_NETWORKS and the bearer of REDPACK_METRICS_TOKEN; 403 for anyone else."""
    if not exposition.allowed(request):
        message = "metrics are for loopback, REDPACK_METRICS_NETWORKS or REDPACK_METRICS_TOKEN"
        return JsonResponse(error_body("permission_denied", message), status=403)
    return HttpResponse(exposition.render(), content_type=CONTENT_TYPE_LATEST)


class HealthDetailsView(APIView):
    """Every probe with its error text, the worker heartbeat, the persist lag and the
    strategies' sections (redpack/health.py): staff only. Its status code is /healthz's."""

    authentication_classes = [UserJWTAuthentication, SessionAuthentication]
    permission_classes = [IsAdminUser]

    @extend_schema(responses={200: OpenApiResponse(description="the health document")})
    def get(self, request: Request) -> Response:
        body, code = health.report()
        return Response(body, status=code)


class FieldsNamed:
    """A token view whose 401 names the body's fields it judged (`named`): the credentials of a
    login, the refresh token of a refresh."""

    named: tuple[str, ...] = ()

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return super().post(request, *args, **kwargs)  # type: ignore[misc,no-any-return]
        except AuthenticationFailed as exc:  # InvalidToken among them
            name_fields(exc, *self.named)
            raise


class LoginView(FieldsNamed, TokenObtainPairView):
    """Takes a user's credentials and returns an access and refresh JSON web token pair. A
    401 names both credentials."""

    named = (get_user_model().USERNAME_FIELD, "password")
    store_may_have_written = False  # a login writes nothing (api/errors.py)


class RefreshView(FieldsNamed, TokenRefreshView):
    """Takes a refresh token and returns a new access token. A 401 names `refresh`."""

    named = ("refresh",)
    store_may_have_written = False
