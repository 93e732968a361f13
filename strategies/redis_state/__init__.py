"""What the Redis strategies share: a grab is decided by one Lua script in Redis, then written
to MySQL before the answer.

MySQL is the source of truth: a grab is answered `grabbed` only once its MySQL transaction
committed, so the Redis state can always be rebuilt from MySQL (rebuild.py, on send and
by `manage.py redis_rebuild`), and the auditor can name every difference between the two
(`audit`). (redis_queue_async answers first and writes later: for it, MySQL plus the grabs
still in its persist stream are the truth; see its `recorded`.) Every key expires
REDPACK_REDIS_STATE_GRACE seconds after the activity does (sooner once closed); without its
state, a grab answers from the activity row: `closed`, or `contended` while an open activity
waits for a rebuild.

- keys.py: key names (one hash tag per activity), marks, running a grab script.
- rebuild.py: MySQL's side of the state, and writing it to Redis.
- rows.py: the MySQL write of a grab Redis decided, and giving Redis back on failure.
- audit.py: Redis against MySQL, difference by difference.
"""

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from redis.exceptions import ConnectionError, RedisError, TimeoutError

from redpack.errors import OutcomeUnknown
from redpack.models import Activity, ActivityStatus

from ..base import CloseResult, GrabResult, GrabStrategy, Outcome
from ..lua import redis_client, script
from ..steps import close_row_locked, held_marks
from .audit import Snapshot, capped, differences
from .keys import GrabReply, Keys, now_ms, parse_mark, run_grab
from .rebuild import Recorded, install
from .rows import write_grab

logger = logging.getLogger(__name__)

CLOSE_SETTLE_SECONDS = 5.0  # how long close() waits for grabs still writing MySQL
REBUILD_SETTLE_SECONDS = 5.0  # how long a rebuild waits for grabs still writing MySQL
REBUILD_FENCE_MARGIN_SECONDS = 30.0  # the fence outlives that wait by this much, then lifts


class RedisStateStrategy(GrabStrategy):
    """A grab is decided by one Lua script in Redis, then written to MySQL before the answer."""

    rebuildable = True

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
        """(Re)write the activity's Redis state from MySQL (rebuild.py)."""
        return install(activity_id, self.state_keys(activity_id))

    def rebuild(self, *, activity_id: int) -> None:
        """Rewrite the state from MySQL while grabs go on: fenced (grabs answer `contended`
        meanwhile, lua/fence.lua), then the grabs that won before the fence are waited for, at
        most REBUILD_SETTLE_SECONDS, so the state read from MySQL holds them; then installed.

        A mark whose row never comes (its attempt answered outcome_unknown, or died) is not
        carried over: nobody was told `grabbed`, and the user's retry grabs afresh.
        """
        keys = self.state_keys(activity_id)
        settle_until = time.monotonic() + REBUILD_SETTLE_SECONDS
        fence_ms = now_ms() + int(1000 * (REBUILD_SETTLE_SECONDS + REBUILD_FENCE_MARGIN_SECONDS))
        holders = script("fence")(keys=keys[:3], args=[fence_ms])
        users = {int(user) for user in holders or []}
        pause = 0.005
        while users and time.monotonic() < settle_until:
            users -= held_marks(activity_id=activity_id, user_ids=users).keys()
            if users:
                time.sleep(pause)
                pause = min(2 * pause, 0.1)
        if users:
            logger.warning(
                "activity %s: %d grabs held in Redis never reached MySQL; rebuilt without them",
                activity_id,
                len(users),
            )
        self.install(activity_id)

    def run_grab(
        self, name: str, activity_id: int, user_id: int, attempt: str, *extra: int
    ) -> GrabReply:
        """Run a grab script for one attempt (keys.run_grab settles a lost reply)."""
        return run_grab(name, self.state_keys(activity_id), user_id, attempt, *extra)

    def answer(self, reply: GrabReply, activity_id: int) -> GrabResult:
        """The answer for a grab script's refusal."""
        if reply.outcome == "already_grabbed":
            assert reply.mark is not None
            return GrabResult(Outcome.ALREADY_GRABBED, parse_mark(reply.mark)[0])
        if reply.outcome == "missing":
            return self.without_state(activity_id)
        return GrabResult(Outcome(reply.outcome))

    def adopt(self, activity_id: int, user_id: int, reply: GrabReply, attempt: str) -> GrabResult:
        """Write the grab an earlier attempt of this user made in Redis but is not known to
        have written to MySQL: its reply was lost (it answered outcome_unknown) or it died.

        The mark first passes to this attempt (lua/adopt.lua), so the earlier one can no
        longer give it back; then this attempt writes the same row. Should the earlier one
        still be writing, UNIQUE (activity, user) keeps one row. The answer is
        `already_grabbed` with the amount: the user holds that earlier attempt's grab, and
        that attempt, if it still answers, is the one that says `grabbed`.
        """
        assert reply.mark is not None and reply.epoch is not None
        try:
            taken = script("adopt")(
                keys=self.state_keys(activity_id)[:3],
                args=[user_id, reply.mark, reply.holder or "", attempt],
            )
        except (ConnectionError, TimeoutError) as exc:
            raise OutcomeUnknown("Redis does not answer; retry to learn the outcome") from exc
        if not taken:
            return GrabResult(Outcome.CONTENDED)  # the mark changed meanwhile
        logger.warning(
            "activity %s: user %s's grab was held in Redis only; written by a later attempt",
            activity_id,
            user_id,
        )
        return self.record(activity_id, user_id, reply, attempt, adopted=True)

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
        self,
        activity_id: int,
        user_id: int,
        reply: GrabReply,
        attempt: str,
        *,
        adopted: bool = False,
    ) -> GrabResult:
        """Write the grab Redis decided to MySQL before answering (rows.py)."""
        assert reply.mark is not None and reply.epoch is not None
        return write_grab(
            activity_id=activity_id,
            user_id=user_id,
            mark_text=reply.mark,
            epoch=reply.epoch,
            attempt=attempt,
            adopted=adopted,
        )

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
                left = close_row_locked(activity_id=activity_id)
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
        found = differences(
            self.recorded(activity, state),
            state,
            mysql_status=activity.status,
            refunded=activity.status == ActivityStatus.REFUNDED,
        )
        return capped(found + self.ttl_differences(keys, state))

    def recorded(self, activity: Activity, state: Snapshot) -> Recorded:
        """What MySQL holds for the activity, which Redis must match."""
        return Recorded.read(activity)

    def ttl_differences(self, keys: list[str], state: Snapshot) -> list[str]:
        return [
            f"{key} never expires" for key, ttl in zip(keys, state.ttls, strict=True) if ttl == -1
        ]
