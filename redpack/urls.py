from django.contrib import admin
from django.urls import include, path

from redpack.api.views import healthz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("redpack.api.urls")),
    path("healthz", healthz, name="healthz"),
]
