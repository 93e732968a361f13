"""Strategies by name, from settings.REDPACK_STRATEGIES (name -> dotted path)."""

from functools import cache

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from .base import GrabStrategy


@cache
def get(name: str) -> GrabStrategy:
    """The strategy instance for `name`; KeyError if it is not configured."""
    strategy_class = import_string(settings.REDPACK_STRATEGIES[name])
    return strategy_class()


def names() -> list[str]:
    return list(settings.REDPACK_STRATEGIES)


def allowed(name: str) -> bool:
    """Configured, and safe unless unsafe strategies are explicitly allowed."""
    return name in settings.REDPACK_STRATEGIES and (
        get(name).safe or settings.REDPACK_ALLOW_UNSAFE_STRATEGIES
    )


def check_strategies(**kwargs: object) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for name, path in settings.REDPACK_STRATEGIES.items():
        try:
            strategy_class = import_string(path)
        except ImportError as exc:
            errors.append(
                checks.Error(
                    f"strategy {name!r}: cannot import {path!r}: {exc}",
                    hint="Fix REDPACK_STRATEGIES in settings.",
                    id="redpack.E001",
                )
            )
            continue
        if not (isinstance(strategy_class, type) and issubclass(strategy_class, GrabStrategy)):
            errors.append(
                checks.Error(
                    f"strategy {name!r}: {path!r} is not a GrabStrategy", id="redpack.E002"
                )
            )
        elif strategy_class.name != name:
            errors.append(
                checks.Error(
                    f"strategy {name!r}: {path!r} calls itself {strategy_class.name!r}",
                    id="redpack.E003",
                )
            )
    return errors


def register_checks() -> None:
    checks.register(check_strategies)
