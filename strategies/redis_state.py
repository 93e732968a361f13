"""What the Redis strategies share: their state in Redis, written from MySQL, and given back.

Keys of one activity share the hash tag `rp:{<id>}:`, so every script touches one slot and runs
unchanged on Redis Cluster: `rp:{42}:meta`, `rp:{42}:count`, `rp:{42}:grabbed`,
`rp:{42}:packets` (lua/install.lua describes each), the per-user locks `rp:{42}:lock:<user>`
and redis_queue_async's persist stream `rp:{42}:persist`.

MySQL is the source of truth: a grab is answered `grabbed` only once its MySQL transaction
committed, so the Redis state can always be rebuilt from MySQL (`install`, on send and by
`manage.py redis_rebuild`), and the auditor can name every difference between the two.
(redis_queue_async answers first and writes later: for it, MySQL plus the grabs still in its
persist stream are the truth; see `recorded`.)
Every key expires REDPACK_REDIS_STATE_GRACE seconds after the activity does (sooner once
closed); without its state, a grab answers from the activity row: `closed`, or `contended`
while an open activity waits for a rebuild.
"""

import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from redis.exceptions import RedisError

from redpack.errors import Forbidden
from redpack.models import Activity, ActivityStatus, GrabDetail, Packet, PacketStatus
from redpack.money import from_cents, minus, to_cents

from .base import CloseResult, GrabResult, GrabStrategy, Outcome
from .lua import redis_client, script

logger = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CLOSE_SETTLE_SECONDS = 5.0  # how long close() waits for grabs still writing MySQL
MAX_DIFFERENCES = 20  # the auditor names this many differences, then counts the rest


def epoch_ms(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(milliseconds=1)


def now_ms() -> int:
    """The web servers' clock, the one expires_at was set by (as the MySQL strategies use)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Keys:
    activity_id: int

    @property
    def tag(self) -> str:
        return f"rp:{{{self.activity_id}}}:"

    def ordered(self) -> list[str]:
        """The KEYS of every script, in this order."""
        return [f"{self.tag}{part}" for part in ("meta", "count", "grabbed", "packets")]

    @property
    def meta(self) -> str:
        return f"{self.tag}meta"

    def lock(self, user_id: int) -> str:
        return f"{self.tag}lock:{user_id}"

    @property
    def persist(self) -> str:
        """redis_queue_async's stream of grabs on their way to MySQL."""
        return f"{self.tag}persist"


def mark(cents: int, packet_id: int | None) -> str:
    """What Redis records for a grab, and how redis_queue stores a packet: cents[:packet_id]."""
    return f"{cents}" if packet_id is None else f"{cents}:{packet_id}"


def parse_mark(text: str) -> tuple[int, int | None]:
    cents, _, packet_id = text.partition(":")
    return int(cents), int(packet_id) if packet_id else None


class PacketTaken(Exception):
    """MySQL does not hold the popped packet as available (or not at that amount): Redis and
    MySQL disagreed, so the packet is not given back to the list."""


class NotRebuildable(Exception):
    """MySQL is not the whole truth about the activity now (redis_queue_async: grabs still on
    their way to MySQL): its Redis state is not rewritten from MySQL."""


Write = Callable[[int, int, int, int | None], None]  # (activity_id, user_id, cents, packet_id)


@dataclass(frozen=True)
class Snapshot:
    """One activity's Redis state read in one atomic step (lua/snapshot.lua)."""

    meta: dict[str, str]
    count: int | None
    grabbed: dict[str, str]  # user id -> mark
    packets: list[str]
    ttls: list[int]  # of each key, in order: -2 missing, -1 no expiry
    stream: list[tuple[str, dict[str, str]]]  # the persist stream's entries, when it was read

    @classmethod
    def read(cls, keys: list[str]) -> "Snapshot":
        meta, count, grabbed, packets, ttls, *stream = script("snapshot")(keys=keys)
        return cls(
            meta=_pairs(meta),
            count=None if count is None else int(count),
            grabbed=_pairs(grabbed),
            packets=[entry.decode() for entry in packets],
            ttls=[int(ttl) for ttl in ttls],
            stream=[(entry_id.decode(), _pairs(fields)) for entry_id, fields in stream[0]]
            if stream
            else [],
        )


@dataclass
class Recorded:
    """What Redis must agree with, in Redis's terms: MySQL's grabs, packets and what is left."""

    grabs: dict[str, str]  # user id -> mark
    count: int
    cents: int
    available: Counter[str]  # packets not yet taken, as marks


class RedisStateStrategy(GrabStrategy):
    """A grab is decided by one Lua script in Redis, then written to MySQL before the answer."""

    def state_keys(self, activity_id: int) -> list[str]:
        """The KEYS every script of this strategy gets."""
        return Keys(activity_id).ordered()

    def prepare(self, activity: Activity) -> None:
        """Write the Redis state once the send commits; prepare() runs inside that transaction."""
        redis_client().ping()  # Redis away: fail the send now rather than every grab later
        activity_id = activity.pk

        def install() -> None:
            try:
                self.install(activity_id)
            except RedisError:
                logger.exception(
                    "activity %s: Redis state not written, grabs answer contended until "
                    "`manage.py redis_rebuild --activity %s`",
                    activity_id,
                    activity_id,
                )

        transaction.on_commit(install)

    def install(self, activity_id: int) -> bool:
        """(Re)write the activity's Redis state from MySQL. Idempotent.

        The activity row stays locked meanwhile: every grab's transaction updates that row, so
        none commits between reading MySQL and writing Redis. False when the script refused
        (redis_queue_async: grabs are still on their way to MySQL).
        """
        with transaction.atomic():
            activity = Activity.objects.select_for_update().get(pk=activity_id)
            marks = [
                (user_id, mark(to_cents(amount), packet_id))
                for user_id, amount, packet_id in GrabDetail.objects.filter(
                    activity_id=activity_id
                ).values_list("user_id", "amount", "redpack_id")
            ]
            packets = [
                mark(to_cents(amount), packet_id)
                for packet_id, amount in Packet.objects.filter(
                    activity_id=activity_id, status=PacketStatus.AVAILABLE
                )
                .order_by("pk")
                .values_list("pk", "amount")
            ]
            expires_ms = epoch_ms(activity.expires_at)
            installed = script("install")(
                keys=self.state_keys(activity_id),
                args=[
                    secrets.token_hex(8),
                    "open" if activity.status == ActivityStatus.OPEN else "closed",
                    expires_ms,
                    expires_ms + settings.REDPACK_REDIS_STATE_GRACE * 1000,
                    activity.allocation,
                    activity.surplus_count,
                    to_cents(activity.surplus_amount),
                    len(marks),
                    *[part for pair in marks for part in pair],
                    *packets,
                ],
            )
        return bool(installed)

    def run_grab(
        self, name: str, activity_id: int, user_id: int, *extra: int
    ) -> tuple[str, str | None, str | None]:
        """Run a grab script: (outcome, mark, epoch of the state it ran on)."""
        reply = script(name)(keys=self.state_keys(activity_id), args=[user_id, now_ms(), *extra])
        outcome, mark_text, epoch = [part.decode() for part in reply] + [None] * (3 - len(reply))
        return outcome, mark_text, epoch

    def answer(self, outcome: str, activity_id: int, mark_text: str | None) -> GrabResult:
        """The answer for a grab script's refusal."""
        if outcome == "already_grabbed":
            assert mark_text is not None
            return GrabResult(Outcome.ALREADY_GRABBED, parse_mark(mark_text)[0])
        if outcome == "missing":
            return self.without_state(activity_id)
        return GrabResult(Outcome(outcome))

    def without_state(self, activity_id: int) -> GrabResult:
        row = Activity.objects.filter(pk=activity_id).values_list("status", "expires_at").first()
        if row is None or row[0] != ActivityStatus.OPEN or row[1] <= timezone.now():
            return GrabResult(Outcome.CLOSED)
        logger.error(
            "activity %s is open but Redis holds no state for it: "
            "run `manage.py redis_rebuild --activity %s`",
            activity_id,
            activity_id,
        )
        return GrabResult(Outcome.CONTENDED)

    def record(
        self, activity_id: int, user_id: int, mark_text: str, epoch: str, write: Write
    ) -> GrabResult:
        """Write the grab Redis decided to MySQL; if that fails, give Redis back what it took."""
        cents, packet_id = parse_mark(mark_text)
        try:
            with transaction.atomic():
                # The activity row first: inserting the detail row takes a shared lock on it (the
                # foreign key check), and two grabs upgrading theirs to exclusive would deadlock.
                Activity.objects.filter(pk=activity_id).update(
                    surplus_count=F("surplus_count") - 1,
                    surplus_amount=minus("surplus_amount", cents),
                    version=F("version") + 1,
                )
                write(activity_id, user_id, cents, packet_id)
        except PacketTaken:
            self.release(activity_id, user_id, mark_text, epoch, restore=False)
            logger.warning(
                "activity %s: packet %s was in Redis but is not available in MySQL; "
                "run `manage.py redis_rebuild --activity %s`",
                activity_id,
                packet_id,
                activity_id,
            )
            return GrabResult(Outcome.CONTENDED)
        except Exception as exc:
            self.release(activity_id, user_id, mark_text, epoch, restore=True)
            if isinstance(exc, IntegrityError):
                held = (
                    GrabDetail.objects.filter(activity_id=activity_id, user_id=user_id)
                    .values_list("amount", flat=True)
                    .first()
                )
                if held is not None:  # MySQL knew of this user's grab although Redis did not
                    return GrabResult(Outcome.ALREADY_GRABBED, to_cents(held))
                if not get_user_model().objects.filter(pk=user_id).exists():
                    # A signed token outliving its user: refused; Redis was given back above.
                    raise Forbidden(f"user {user_id} does not exist") from exc
            raise
        return GrabResult(Outcome.GRABBED, cents)

    def release(
        self, activity_id: int, user_id: int, mark_text: str, epoch: str, *, restore: bool
    ) -> None:
        try:
            released = script("release")(
                keys=Keys(activity_id).ordered(),
                args=[user_id, mark_text, epoch, "restore" if restore else "forget"],
            )
        except RedisError:
            logger.exception(
                "activity %s: the failed grab of user %s is still held in Redis; "
                "run `manage.py redis_rebuild --activity %s`",
                activity_id,
                user_id,
                activity_id,
            )
            return
        if not released:
            logger.info("activity %s: state rebuilt since user %s grabbed", activity_id, user_id)

    def close(self, *, activity_id: int) -> CloseResult:
        """Close in Redis (grabs answer `closed` from then on), then in MySQL.

        Grabs that won in Redis just before may still be writing MySQL (or giving back): what is
        left is known once Redis and MySQL agree on it, when the last of those writes is done.
        """
        keys = Keys(activity_id).ordered()
        give_up = time.monotonic() + CLOSE_SETTLE_SECONDS
        while True:
            in_redis = script("close")(
                keys=keys, args=[now_ms(), settings.REDPACK_REDIS_STATE_GRACE * 1000]
            )
            with transaction.atomic():
                activity = Activity.objects.select_for_update().get(pk=activity_id)
                if activity.status == ActivityStatus.OPEN:
                    Activity.objects.filter(pk=activity_id).update(
                        status=ActivityStatus.CLOSED, version=F("version") + 1
                    )
            left = CloseResult(activity.surplus_count, to_cents(activity.surplus_amount))
            if in_redis is None or CloseResult(*in_redis) == left:
                return left
            if time.monotonic() >= give_up:
                logger.warning(
                    "activity %s closed with %s left in MySQL but %s in Redis; MySQL is the record",
                    activity_id,
                    left,
                    in_redis,
                )
                return left
            time.sleep(0.01)

    def audit(self, activity: Activity) -> list[str]:
        """Every difference between the activity's Redis state and MySQL."""
        keys = self.state_keys(activity.pk)
        try:
            state = Snapshot.read(keys)
        except RedisError as exc:
            return [f"cannot read the Redis state: {exc}"]
        if not state.meta:
            grace = timedelta(seconds=settings.REDPACK_REDIS_STATE_GRACE)
            if (
                activity.status == ActivityStatus.OPEN
                and timezone.now() < activity.expires_at + grace
            ):
                return [f"Redis holds no state for open activity {activity.pk}"]
            return []  # expired with its activity, or lost after the close: MySQL is the record
        differences: list[str] = []
        redis_status = state.meta["status"]
        mysql_open = activity.status == ActivityStatus.OPEN
        if (redis_status == "open") != mysql_open:
            differences.append(
                f"activity is {activity.status} in MySQL but {redis_status} in Redis"
            )
        recorded = self.recorded(activity, state)
        differences += _grab_differences(recorded.grabs, state.grabbed)
        if activity.status != ActivityStatus.REFUNDED:  # a refund empties MySQL, not Redis
            differences += _left_differences(recorded, state)
        differences += self.ttl_differences(keys, state)
        if len(differences) > MAX_DIFFERENCES:
            more = len(differences) - MAX_DIFFERENCES
            differences = [*differences[:MAX_DIFFERENCES], f"and {more} more differences"]
        return differences

    def recorded(self, activity: Activity, state: Snapshot) -> Recorded:
        """What MySQL holds for the activity, which Redis must match."""
        return Recorded(
            grabs={
                str(user_id): mark(to_cents(amount), packet_id)
                for user_id, amount, packet_id in GrabDetail.objects.filter(
                    activity=activity
                ).values_list("user_id", "amount", "redpack_id")
            },
            count=activity.surplus_count,
            cents=to_cents(activity.surplus_amount),
            available=Counter(
                mark(to_cents(amount), packet_id)
                for packet_id, amount in Packet.objects.filter(
                    activity=activity, status=PacketStatus.AVAILABLE
                ).values_list("pk", "amount")
            ),
        )

    def ttl_differences(self, keys: list[str], state: Snapshot) -> list[str]:
        return [
            f"{key} never expires" for key, ttl in zip(keys, state.ttls, strict=True) if ttl == -1
        ]


def _pairs(flat: list[bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}


def _show(mark_text: str | None) -> str:
    if mark_text is None:
        return "nothing"
    cents, packet_id = parse_mark(mark_text)
    return f"{from_cents(cents)}" + ("" if packet_id is None else f" (packet {packet_id})")


def _grab_differences(recorded: dict[str, str], in_redis: dict[str, str]) -> list[str]:
    return [
        f"user {user} has {_show(recorded.get(user))} in MySQL but {_show(in_redis.get(user))} "
        f"in Redis"
        for user in sorted(recorded.keys() | in_redis.keys(), key=int)
        if recorded.get(user) != in_redis.get(user)
    ]


def _left_differences(recorded: Recorded, state: Snapshot) -> list[str]:
    differences = []
    if state.count != recorded.count:
        differences.append(f"{recorded.count} packets left in MySQL but {state.count} in Redis")
    redis_cents = int(state.meta["remaining_cents"])
    if redis_cents != recorded.cents:
        differences.append(
            f"{from_cents(recorded.cents)} left in MySQL but {from_cents(redis_cents)} in Redis"
        )
    available = recorded.available
    listed = Counter(state.packets)
    for entry in sorted(available.keys() | listed.keys()):
        if available[entry] == listed[entry]:
            continue
        cents, packet_id = parse_mark(entry)
        if listed[entry] == 0:
            differences.append(
                f"packet {packet_id} ({from_cents(cents)}) available in MySQL but not in Redis list"
            )
        elif available[entry] == 0:
            differences.append(
                f"packet {packet_id} ({from_cents(cents)}) in Redis list but not available in MySQL"
            )
        else:
            differences.append(f"packet {packet_id} is in the Redis list {listed[entry]} times")
    return differences
