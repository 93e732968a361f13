"""Settings read on every grab, at the price of a dictionary lookup.

Each read of `django.conf.settings.X` runs Python code (LazyObject.__getattribute__, which also
asks the value for `_mask_wrapped` and so raises and catches an AttributeError inside); the
grab path read half a dozen settings per grab (each 2.5–3k instructions, about 3% of a lone
grab's in all). `hot.X` reads settings.X once and keeps it until Django signals that X changed
(override_settings, pytest-django's `settings` fixture). A setting assigned on
`django.conf.settings` by other means after it was first read here is not seen: set settings
before the first request, as Django expects anyway.
"""

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver


class _Hot:
    def __getattr__(self, name: str) -> Any:  # only called for a setting not kept yet
        value = getattr(settings, name)
        self.__dict__[name] = value
        return value


hot = _Hot()


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    hot.__dict__.pop(setting, None)
