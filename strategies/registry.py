"""Strategies by name, from settings.REDPACK_STRATEGIES (name -> dotted path)."""

from functools import cache

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils.module_loading import import_string

from .base import BackgroundTask, GrabStrategy


@cache
def get(name: str) -> GrabStrategy:
    """The strategy instance for `name`; KeyError if it is not configured."""
    strategy_class = import_string(settings.REDPACK_STRATEGIES[name])
    return strategy_class()


def names() -> list[str]:
    return list(settings.REDPACK_STRATEGIES)


def background_tasks(task: str) -> list[BackgroundTask]:
    """The distinct functions the configured strategies give for a periodic task, each once
    (two names of one mechanism share its task)."""
    found: list[BackgroundTask] = []
    for name in names():
        run = get(name).background_tasks().get(task)
        if run is not None and run not in found:
            found.append(run)
    return found


def once_per_implementation(method: str) -> list[GrabStrategy]:
    """One configured strategy per distinct implementation of `method`: strategies that share
    a mechanism (and so its method) are asked once."""
    seen: list[object] = []
    found = []
    for name in names():
        strategy = get(name)
        implementation = getattr(type(strategy), method)
        if implementation not in seen:
            seen.append(implementation)
            found.append(strategy)
    return found


def health() -> tuple[float | None, dict[str, object]]:
    """The largest persist lag of the configured strategies (None: none writes behind) and the
    sections they add to /healthz, merged by key; one reading per implementation, so that two
    names of one mechanism report the same figures."""
    lags: list[float] = []
    sections: dict[str, object] = {}
    for strategy in once_per_implementation("health"):
        reading = strategy.health()
        if reading is not None:
            lags.append(reading.persist_lag)
            sections.update(reading.sections)
    return max(lags, default=None), sections


def state_lost() -> str | None:
    """Why some open activities have lost the state their strategy keeps outside MySQL, or None;
    asked once per implementation (strategies sharing a mechanism share its answer)."""
    for strategy in once_per_implementation("state_lost"):
        reason = strategy.state_lost()
        if reason is not None:
            return reason
    return None


def allowed(name: str) -> bool:
    """Configured, exact on this database, and safe unless unsafe strategies are allowed."""
    return name in settings.REDPACK_STRATEGIES and unavailable_reason(name) is None


def unavailable_reason(name: str) -> str | None:
    """Why a configured strategy may not be chosen here, or None when it may."""
    strategy = get(name)
    vendor = connections[DEFAULT_DB_ALIAS].vendor
    if strategy.requires and vendor not in strategy.requires:
        needs = " or ".join(sorted(strategy.requires))
        return f"needs {needs}; this server runs on {vendor}"
    if not strategy.safe and not settings.REDPACK_ALLOW_UNSAFE_STRATEGIES:
        return "unsafe (oversells under contention); set REDPACK_ALLOW_UNSAFE_STRATEGIES=1"
    return None


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
