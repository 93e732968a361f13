from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework_simplejwt.views import TokenObtainPairView, TokenRefreshView

from . import views

urlpatterns = [
    path("", views.ApiRootView.as_view(), name="api-root"),
    path("activities/", views.ActivityCreateView.as_view(), name="activity-create"),
    path("activities/<int:pk>/", views.ActivityDetailView.as_view(), name="activity-detail"),
    path("activities/<int:pk>/grab/", views.GrabView.as_view(), name="activity-grab"),
    path("activities/<int:pk>/grabs/", views.ActivityGrabsView.as_view(), name="activity-grabs"),
    path("me/grabs/", views.MyGrabsView.as_view(), name="my-grabs"),
    path("me/refunds/", views.MyRefundsView.as_view(), name="my-refunds"),
    path("me/wallet/", views.MyWalletView.as_view(), name="my-wallet"),
    path("ping/", views.PingView.as_view(), name="ping"),
    path("strategies/", views.StrategyListView.as_view(), name="strategies"),
    path("token/", TokenObtainPairView.as_view(), name="token-obtain"),
    path("token/refresh/", TokenRefreshView.as_view(), name="token-refresh"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
]
