from django.apps import AppConfig


class RedpackConfig(AppConfig):
    name = "redpack"
    verbose_name = "Red packets"

    def ready(self) -> None:
        from strategies import registry

        from . import checks, logs, signals
        from .api import schema  # noqa: F401 - registers the OpenAPI extensions

        registry.register_checks()
        checks.register()
        signals.connect()
        logs.carry_request_ids()
        logs.demote_client_refusals()
