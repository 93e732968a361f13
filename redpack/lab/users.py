"""Bench users: created once, reused by every run, authenticated by long-lived signed tokens."""

import csv
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractBaseUser
from rest_framework_simplejwt.tokens import AccessToken

from redpack.ledger import wallets_top_up

CHUNK = 5000


def bench_users_ensure(*, count: int, prefix: str = "bench") -> tuple[list[int], int]:
    """Ids of the users `<prefix>000000` … in name order, creating the missing ones, each
    wallet topped up to REDPACK_STARTING_BALANCE.

    Returns (ids, how many were created). Works in chunks, so 100,000 users stay cheap.
    """
    User = get_user_model()
    names = [f"{prefix}{i:06d}" for i in range(count)]
    unusable = make_password(None)  # bench users log in only with the tokens written for them
    created = 0
    ids: list[int] = []
    for start in range(0, count, CHUNK):
        chunk = names[start : start + CHUNK]
        existing = set(User.objects.filter(username__in=chunk).values_list("username", flat=True))
        missing = [User(username=n, password=unusable) for n in chunk if n not in existing]
        User.objects.bulk_create(missing, batch_size=1000)
        created += len(missing)
        in_chunk = User.objects.filter(username__in=chunk).order_by("username")
        ids.extend(in_chunk.values_list("pk", flat=True))
    wallets_top_up(user_ids=ids, memo="bench users")
    return ids, created


def bench_sender(*, prefix: str = "bench") -> AbstractBaseUser:
    """The user that sends bench activities, kept apart from the grabbers; its wallet topped
    up to REDPACK_STARTING_BALANCE, which covers any one send."""
    sender, _ = get_user_model().objects.get_or_create(
        username=f"{prefix}-sender", defaults={"password": make_password(None)}
    )
    wallets_top_up(user_ids=[sender.pk], memo="bench sender")
    return sender


def bench_authorization(user: AbstractBaseUser, *, ttl: timedelta) -> str:
    """The full `Authorization` header value: a signed access token valid for `ttl`."""
    token = AccessToken.for_user(user)
    token.set_exp(lifetime=ttl)
    return f"Bearer {token}"


def bench_users_write_csv(*, user_ids: Sequence[int], path: str | Path, ttl: timedelta) -> None:
    """Write `username,authorization` rows, in the order of `user_ids`."""
    User = get_user_model()
    with open(path, "w", newline="") as handle:
        # `\n` line ends (the csv module's default is `\r\n`): `cut -d, -f2` of a row is a
        # header value curl can send as it is.
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["username", "authorization"])
        for start in range(0, len(user_ids), CHUNK):
            chunk = user_ids[start : start + CHUNK]
            users = User.objects.in_bulk(chunk)
            for user_id in chunk:
                user = users[user_id]
                writer.writerow([user.get_username(), bench_authorization(user, ttl=ttl)])
