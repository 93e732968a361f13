from django.contrib import admin
from django.urls import include, path

from redpack.api.views import HealthDetailsView, healthz, metrics
from redpack.views import home

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    path("api/", include("redpack.api.urls")),
    path("healthz", healthz, name="healthz"),
    path("healthz/details", HealthDetailsView.as_view(), name="healthz-details"),
    path("metrics", metrics, name="metrics"),
]

handler400 = "redpack.api.handlers.bad_request"
handler404 = "redpack.api.handlers.not_found"
handler500 = "redpack.api.handlers.server_error"
