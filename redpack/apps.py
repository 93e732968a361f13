from django.apps import AppConfig


class RedpackConfig(AppConfig):
    name = "redpack"
    verbose_name = "Red packets"

    def ready(self) -> None:
        from strategies import registry

        registry.register_checks()
