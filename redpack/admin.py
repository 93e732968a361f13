import json
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from strategies import registry

from . import expiry, ledger, selectors, services, validation
from .allocation import Allocation
from .errors import RedpackError
from .lab import report
from .lab.stats import histogram_buckets
from .models import (
    UNRESOLVED_FAILURES,
    Account,
    AccountKind,
    Activity,
    JournalEntry,
    JournalLine,
    PersistFailure,
    PersistFailureStatus,
    Refund,
)
from .money import AMOUNT_FORMAT, AMOUNT_TEXT

REPORTS = settings.BASE_DIR / "reports"


class ActivitySendForm(forms.ModelForm):
    """Creation goes through services.activity_send, like the API, so packets get prepared;
    the form checks with the same validator (validation.activity_send_validate)."""

    expires_in = forms.IntegerField()  # bounds from settings, set per form in __init__

    class Meta:
        model = Activity
        fields = ["total_amount", "total_count", "strategy", "allocation"]

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        limits = validation.send_limits()
        self.fields["strategy"] = forms.ChoiceField(
            choices=[(n, f"{n} — {registry.get(n).label}") for n in limits.strategies]
        )
        self.fields["allocation"] = forms.ChoiceField(
            choices=[(a, a) for a in limits.allocations], initial=Allocation.DOUBLE_AVERAGE
        )
        self.fields["total_count"] = forms.IntegerField(min_value=1, max_value=limits.max_count)
        self.fields["expires_in"] = forms.IntegerField(
            initial=validation.DEFAULT_EXPIRES_IN,
            min_value=limits.min_expires_in,
            max_value=limits.max_expires_in,
            help_text="Seconds until the activity expires.",
        )

    sender_id: int | None = None  # set by ActivityAdmin.get_form: the staff user sending

    def clean(self) -> dict:
        data = super().clean() or {}
        if not self.errors:
            try:
                validation.activity_send_validate(
                    total_amount=data["total_amount"],
                    total_count=data["total_count"],
                    strategy=data["strategy"],
                    allocation_kind=data["allocation"],
                    expires_in=data["expires_in"],
                )
            except RedpackError as exc:
                self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        if not self.errors and self.sender_id is not None:
            balance = selectors.wallet_balance(user_id=self.sender_id)
            if balance < data["total_amount"]:
                self.add_error("total_amount", f"your wallet holds {balance}")
        return data


GRABS_PER_PAGE = 25  # the activity page's grabs, newest first, a page at a time
LIVE_SECONDS = 2  # how often an open activity's page asks for its progress and grabs


class ReadOnlyAdmin(admin.ModelAdmin):
    """Written by the services only (the books, refunds, dead letters): read here, never
    saved."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Activity)
class ActivityAdmin(admin.ModelAdmin):
    """Activities are sent here (through services.activity_send) and then only watched: their
    pages are read-only; progress and grabs refresh in place (`live/`), "expire now" asks first."""

    actions = ["expire_now"]
    list_display = [
        "id",
        "sender",
        "strategy",
        "allocation",
        "state",
        "progress",
        "surplus_amount",
        "total_amount",
        "refunded",
        "escrow_balance",
        "expires_at",
    ]
    list_filter = ["strategy", "status", "allocation"]
    search_fields = ["id", "sender__username"]
    fieldsets = [
        (None, {"fields": ["sender", "strategy", "allocation", "total_amount", "total_count"]}),
        ("Dates", {"fields": ["created_at", "expires_at"]}),
        ("Money", {"fields": ["escrow_balance"]}),
        ("Internals", {"fields": ["status", "version", "waiting_to_persist"]}),
    ]
    readonly_fields = ["waiting_to_persist", "escrow_balance"]

    @admin.display(description="escrow")
    def escrow_balance(self, activity: Activity) -> str:
        """What the activity's escrow holds: its surplus and the grabs not credited yet."""
        escrow = getattr(activity, "escrow", None)
        return "—" if escrow is None else str(escrow.balance)

    @admin.display(description="waiting to persist")
    def waiting_to_persist(self, activity: Activity) -> str:
        """Write-behind strategies: grabs answered but not yet in MySQL."""
        try:
            pending = registry.get(activity.strategy).pending_writes(activity_id=activity.pk)
        except Exception as exc:  # noqa: BLE001 - shown, not fatal: the page is still useful
            return f"unknown: {exc}"
        if pending is None:
            return "— (written before the answer)"
        return f"{pending.waiting} in Redis, {pending.failed} failed"

    @admin.display(description="state")
    def state(self, activity: Activity) -> str:
        return selectors.activity_state(activity)

    @admin.display(description="refunded")
    def refunded(self, activity: Activity) -> str:
        refund = getattr(activity, "refund", None)
        return f"{refund.amount} ({refund.count})" if refund else "—"

    @admin.display(description="grabbed / total")
    def progress(self, activity: Activity) -> str:
        grabbed = selectors.activity_grabbed_count(activity)
        return format_html(
            '<progress max="{}" value="{}"></progress> {} / {}',
            activity.total_count,
            grabbed,
            grabbed,
            activity.total_count,
        )

    @admin.action(description="Expire now and refund the sender", permissions=["expire"])
    def expire_now(self, request: HttpRequest, queryset):  # type: ignore[no-untyped-def]
        """Asks first (a page listing what each refund would return), then expires."""
        if request.POST.get("confirmed") != "yes":
            return self.expire_confirmation(request, list(queryset))
        self.expire(request, queryset)
        return None

    def expire(self, request: HttpRequest, activities) -> None:  # type: ignore[no-untyped-def]
        refunded = 0
        for activity in activities:
            if selectors.activity_state(activity) == selectors.ActivityState.REFUNDED:
                continue
            try:
                services.activity_expire(activity_id=activity.pk, force=True)
                refunded += 1
            except expiry.NotSettled as exc:
                self.message_user(request, str(exc), messages.WARNING)
        self.message_user(request, f"{refunded} activities expired and refunded.")

    def expire_confirmation(self, request: HttpRequest, activities: list) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": "Expire now and refund the sender?",
            "opts": self.model._meta,
            "activities": [(a, selectors.activity_state(a)) for a in activities],
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/redpack/activity/expire_confirmation.html", context)

    def expire_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The activity page's "Expire now" button: asks on GET, expires on POST."""
        if not self.has_expire_permission(request):
            raise PermissionDenied
        activity = self.get_object(request, object_id)
        if activity is None:
            raise Http404(f"activity {object_id} does not exist")
        if request.method == "POST":
            self.expire(request, [activity])
            return HttpResponseRedirect(
                reverse("admin:redpack_activity_change", args=[activity.pk])
            )
        return self.expire_confirmation(request, [activity])

    def has_expire_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("redpack.expire_activity")

    def get_queryset(self, request: HttpRequest):  # type: ignore[no-untyped-def]
        return super().get_queryset(request).select_related("sender", "refund", "escrow")

    def get_form(self, request, obj=None, change=False, **kwargs):  # type: ignore[no-untyped-def]
        if obj is None:
            kwargs["form"] = type(
                "ActivitySendForm", (ActivitySendForm,), {"sender_id": request.user.pk}
            )
            kwargs["fields"] = [
                "total_amount",
                "total_count",
                "strategy",
                "allocation",
                "expires_in",
            ]
        return super().get_form(request, obj, change, **kwargs)

    def get_fieldsets(self, request, obj=None):  # type: ignore[no-untyped-def]
        if obj is None:
            return [(None, {"fields": list(self.get_form(request).base_fields)})]
        return self.fieldsets

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        return self.readonly_fields if obj is not None else []

    def save_model(self, request, obj, form, change):  # type: ignore[no-untyped-def]
        data = form.cleaned_data
        created = services.activity_send(
            sender_id=request.user.pk,
            total_amount=data["total_amount"],
            total_count=data["total_count"],
            strategy=data["strategy"],
            allocation_kind=data["allocation"],
            expires_in=data["expires_in"],
        )
        obj.pk = created.pk
        obj.refresh_from_db()

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # activities are immutable once sent: state changes only through grabs

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def change_view(self, request, object_id, form_url="", extra_context=None):  # type: ignore[no-untyped-def]
        activity = self.get_object(request, object_id)
        context = {
            **(extra_context or {}),
            **(self.live_context(request, activity) if activity else {}),
            "can_expire": self.has_expire_permission(request),
        }
        return super().change_view(request, object_id, form_url, extra_context=context)

    def live_context(self, request: HttpRequest, activity: Activity) -> dict[str, Any]:
        """What the activity page shows and `live/` refreshes: state, progress, rate, refund,
        a page of grabs (newest first)."""
        grabbed = selectors.activity_grabbed_count(activity)
        grabs = selectors.activity_grabs(
            activity_id=activity.pk,
            viewer_id=int(request.user.pk),  # type: ignore[arg-type]
            viewer_is_staff=True,
            newest_first=True,
        )
        page = Paginator(grabs, GRABS_PER_PAGE).get_page(request.GET.get("page"))
        rate = selectors.activity_grab_rate(activity_id=activity.pk)
        state = selectors.activity_state(activity)
        return {
            "activity": activity,
            "state": state,
            "live": state == selectors.ActivityState.OPEN,
            "live_seconds": LIVE_SECONDS,
            "grabbed": grabbed,
            "percent": round(100 * grabbed / activity.total_count),
            "rate": None if rate is None else f"{rate:,.1f}",
            "refund": getattr(activity, "refund", None),
            "redis_state": self.redis_state(activity, state),
            "page": page,
        }

    def redis_state(self, activity: Activity, state: str) -> str | None:
        """Why this open activity's grabs cannot be answered now (its Redis state is lost)."""
        if state != selectors.ActivityState.OPEN or not registry.get(activity.strategy).rebuildable:
            return None
        try:
            return registry.get(activity.strategy).state_lost()
        except Exception as exc:  # noqa: BLE001 - shown on the page
            return f"unknown: {exc}"

    def live_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        activity = self.get_object(request, object_id)
        if activity is None:
            raise Http404(f"activity {object_id} does not exist")
        context = self.live_context(request, activity)
        return TemplateResponse(request, "admin/redpack/activity/live.html", context)

    def get_urls(self):  # type: ignore[no-untyped-def]
        view = self.admin_site.admin_view
        return [
            path("report/", view(self.report_view), name="redpack_activity_report"),
            path("report/chart.png", view(self.report_chart), name="redpack_activity_chart"),
            path("<path:object_id>/live/", view(self.live_view), name="redpack_activity_live"),
            path(
                "<path:object_id>/expire/", view(self.expire_view), name="redpack_activity_expire"
            ),
            *super().get_urls(),
        ]

    def report_view(self, request: HttpRequest) -> HttpResponse:
        """The latest `make compare` (reports/compare.json and .png) when this machine made it,
        else a word saying none has run here (and the committed one, marked as another
        machine's); figures as percentages, a recommendation per workload."""
        report_file = REPORTS / "compare.json"
        data = json.loads(report_file.read_text()) if report_file.exists() else {}
        results = data.get("results", [])
        headers, rows = report.shown_rows(results)
        without_redis = [n for n in registry.names() if not registry.get(n).uses_redis]
        context = {
            **self.admin_site.each_context(request),
            "title": "Latest comparison",
            "opts": self.model._meta,
            "context": data.get("context", {}),
            "here": report.measured_here(data.get("context", {})),
            "machine": report.this_machine(),
            "ceilings": data.get("ceilings", []),
            "headers": headers,
            "rows": rows,
            "results": results,
            "recommendations": report.recommendations(results, without_redis=without_redis),
            **http_runs(results),
        }
        return TemplateResponse(request, "admin/redpack/report.html", context)

    def report_chart(self, request: HttpRequest) -> FileResponse:
        chart = REPORTS / "compare.png"
        if not chart.exists():
            raise Http404("no chart yet: run make compare")
        return FileResponse(chart.open("rb"), content_type="image/png")


@admin.register(Refund)
class RefundAdmin(ReadOnlyAdmin):
    list_display = ["activity", "sender", "amount", "count", "created_at"]
    list_select_related = ["activity__sender"]
    readonly_fields = ["activity", "amount", "count", "created_at"]

    @admin.display(description="sender")
    def sender(self, refund: Refund) -> str:
        return str(refund.activity.sender)


@admin.register(PersistFailure)
class PersistFailureAdmin(ReadOnlyAdmin):
    """redis_queue_async's grabs that failed to reach MySQL on their own, dead letters first."""

    actions = ["retry"]
    list_display = [
        "id",
        "activity",
        "user_id",
        "amount",
        "packet_id",
        "status",
        "attempts",
        "last_failed_at",
        "short_error",
    ]
    list_filter = ["status"]
    search_fields = ["activity__id", "user_id", "entry_id"]
    readonly_fields = [
        "activity",
        "entry_id",
        "payload",
        "user_id",
        "amount",
        "packet_id",
        "status",
        "attempts",
        "error",
        "first_failed_at",
        "last_failed_at",
        "resolved_at",
    ]

    def get_queryset(self, request: HttpRequest):  # type: ignore[no-untyped-def]
        return super().get_queryset(request).order_by("status", "-last_failed_at")

    @admin.display(description="error")
    def short_error(self, failure: PersistFailure) -> str:
        return failure.error if len(failure.error) <= 80 else f"{failure.error[:79]}…"

    @admin.action(description="Retry: write these grabs to MySQL now", permissions=["retry"])
    def retry(self, request: HttpRequest, queryset) -> None:  # type: ignore[no-untyped-def]
        done = 0
        for failure in queryset.exclude(status=PersistFailureStatus.RESOLVED).select_related(
            "activity"
        ):
            strategy = registry.get(failure.activity.strategy)
            error = strategy.retry_failed_write(failure_id=failure.pk)
            if error is None:
                done += 1
            else:
                self.message_user(request, f"{failure}: {error}", messages.ERROR)
        self.message_user(request, f"{done} grabs written to MySQL.")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("redpack.retry_persistfailure")

    def changelist_view(self, request, extra_context=None):  # type: ignore[no-untyped-def]
        try:
            lag = registry.health()[1].get("persist", {})
        except Exception as exc:  # noqa: BLE001 - shown on the page
            lag = {"error": str(exc)}
        unresolved = PersistFailure.objects.filter(status__in=UNRESOLVED_FAILURES).count()
        context = {"persist_lag": lag, "unresolved": unresolved}
        return super().changelist_view(request, extra_context={**context, **(extra_context or {})})


class DepositForm(forms.Form):
    username = forms.CharField(max_length=150)
    # Written as the API takes amounts (money.AMOUNT_TEXT): Django's DecimalField also took
    # `1e3`, `1E+2` and other scripts' digits.
    amount = forms.CharField(max_length=20, help_text="e.g. 100.00")
    memo = forms.CharField(max_length=200, required=False)

    def clean_username(self) -> int:
        user = get_user_model().objects.filter(username=self.cleaned_data["username"]).first()
        if user is None:
            raise forms.ValidationError("no such user")
        return int(user.pk)

    def clean_amount(self) -> Decimal:
        text = self.cleaned_data["amount"]
        if not AMOUNT_TEXT.fullmatch(text):
            raise forms.ValidationError(AMOUNT_FORMAT)
        amount = Decimal(text)
        try:
            ledger.deposit_cents(amount)
        except RedpackError as exc:
            raise forms.ValidationError(exc.message) from exc
        return amount


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    """Wallets, the funding account and the escrows, with the crediting lag above them and a
    deposit page (a journal entry from the funding account) for staff allowed to deposit."""

    list_display = ["id", "kind", "user", "activity", "balance"]
    list_filter = ["kind"]
    list_select_related = ["user"]
    search_fields = ["user__username", "activity__id"]
    fields = ["kind", "user", "activity", "balance"]

    def get_urls(self):  # type: ignore[no-untyped-def]
        view = self.admin_site.admin_view
        return [
            path("deposit/", view(self.deposit_view), name="redpack_account_deposit"),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):  # type: ignore[no-untyped-def]
        try:
            lag: dict[str, Any] = ledger.crediting_lag()
        except Exception as exc:  # noqa: BLE001 - shown on the page
            lag = {"error": str(exc)}
        context = {"crediting": lag, "can_deposit": self.has_deposit_permission(request)}
        return super().changelist_view(request, extra_context={**context, **(extra_context or {})})

    def has_deposit_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("redpack.deposit")

    def deposit_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_deposit_permission(request):
            raise PermissionDenied
        form = DepositForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            ledger.wallet_deposit(
                user_id=data["username"],
                amount=data["amount"],
                by_id=request.user.pk,
                memo=data["memo"],
            )
            self.message_user(request, f"{data['amount']} deposited.")
            return HttpResponseRedirect(
                f"{reverse('admin:redpack_account_changelist')}?kind={AccountKind.WALLET}"
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Deposit into a wallet",
            "opts": self.model._meta,
            "form": form,
        }
        return TemplateResponse(request, "admin/redpack/account/deposit.html", context)


class JournalLineInline(admin.TabularInline):
    model = JournalLine
    fields = ["account", "amount"]
    readonly_fields = ["account", "amount"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(JournalEntry)
class JournalEntryAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "activity_id", "grab_id", "refund_id", "created_by", "created_at"]
    list_filter = ["kind"]
    search_fields = ["activity__id", "lines__account__user__username"]
    fields = ["kind", "activity_id", "grab", "refund", "created_by", "memo", "created_at"]
    readonly_fields = ["activity_id"]
    inlines = [JournalLineInline]


def http_runs(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's HTTP runs as the admin page shows them: percentages, and each run's
    latency histogram laid out on the buckets any run has (redpack/lab/stats.py's order)."""
    runs = [dict(r) for r in results if str(r.get("run", "")).startswith("HTTP")]
    buckets = histogram_buckets(r.get("latency_histogram") or {} for r in runs)
    for run in runs:
        counts = run.get("latency_histogram") or {}
        run["histogram_cells"] = [counts.get(b) for b in buckets]
        run["causes"] = run.get("causes") or {}
        run["p99_budget_text"], run["p99_budget_over"] = report.shown_cell(run, "budget")
        run["rounds_text"], run["rounds_flagged"] = report.shown_cell(run.get("rounds"), "rounds")
        run["pings_failed_text"], _ = report.shown_cell(run.get("pings_failed"), "pings_failed")
        steal = (run.get("steal_share"), run.get("steal_share_beside"))
        run["steal_text"], run["steal_apart"] = report.shown_cell(steal, "steal")
        for key, shown in (
            ("within_1s", "within_1s_percent"),
            ("generator_cpu_share", "generator_cpu_percent"),
        ):
            value = run.get(key)
            run[shown] = "–" if value is None else f"{100 * value:.1f}%"
    columns = {key for key, _, _ in report.http_columns(runs)}
    return {
        "http_runs": runs,
        "buckets": buckets,
        "http_rounds": "rounds" in columns,
        "http_pings_failed": "pings_failed" in columns,
    }
