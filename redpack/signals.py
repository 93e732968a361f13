"""Keep the disabled users' set (redpack/bans.py) in step with every save and delete of a user;
make the platform's funding account after migrate (and after a test database's flush)."""

from typing import Any

from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_migrate, post_save

from . import bans, ledger


def _user_saved(*, instance: Any, **kwargs: Any) -> None:
    user_id, disabled = instance.pk, not instance.is_active
    # After the commit: a rolled back deactivation must not ban anybody. Robust: with Redis away
    # the save stands and the beat re-sync (bans.sync) records it within a minute.
    transaction.on_commit(lambda: bans.set_disabled(user_id, disabled), robust=True)


def _user_deleted(*, instance: Any, **kwargs: Any) -> None:
    user_id = instance.pk
    transaction.on_commit(lambda: bans.set_disabled(user_id, True), robust=True)


def _migrated(**kwargs: Any) -> None:
    ledger.funding_account()


def connect() -> None:
    user_model = get_user_model()
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="redpack.bans.saved")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid="redpack.bans.deleted")
    post_migrate.connect(
        _migrated, sender=apps.get_app_config("redpack"), dispatch_uid="redpack.ledger.funding"
    )
