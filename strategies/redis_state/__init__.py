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
- rows.py: the MySQL write of the grabs Redis decided (group commit for a batch), and giving
  Redis back on failure.

Batching (strategies/combiner.py): concurrent grabs of one activity in one process join a batch;
one script run decides all of them (lua/grab.lua takes many users)
and one MySQL transaction writes the winners. A lone grab is a batch of one. `batched = False`
keeps the seeds' one grab per round trip, for comparison.
- audit.py: Redis against MySQL, difference by difference.
"""

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from datetime import timedelta
from functools import cached_property
from typing import ClassVar

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from redis.exceptions import ConnectionError, RedisError, TimeoutError

from redpack import shards
from redpack.errors import OutcomeUnknown
from redpack.hotsettings import hot
from redpack.models import Activity, ActivityStatus

from .. import registry
from ..base import CloseResult, GrabResult, GrabStrategy, Holders, Outcome, RequestChecks, TooMany
from ..combiner import Combiner
from ..lua import redis_client, script, takes_writes
from ..request_checks import REFUSALS, checks_arg, refused
from ..steps import close_row_locked, held_cents, held_marks
from .audit import Snapshot, capped, differences
from .keys import (
    GrabReply,
    Keys,
    new_attempt,
    now_ms,
    parse_mark,
    run_grabs,
    split_held,
)
from .presence import state_lost
from .rebuild import Recorded, install
from .rows import Won, write_grab, write_grabs, write_grabs_raw

logger = logging.getLogger(__name__)

CLOSE_SETTLE_SECONDS = 5.0  # how long close() waits for grabs still writing MySQL
REBUILD_SETTLE_SECONDS = 5.0  # how long a rebuild waits for grabs still writing MySQL
REBUILD_FENCE_MARGIN_SECONDS = 30.0  # the fence outlives that wait by this much, then lifts
DUPLICATE_WAIT_SECONDS = 3.0  # a repeated click waits this long for the first click's write

Member = tuple[int, str, str]  # (user_id, attempt, request_checks.checks_arg) in a batch
Decision = GrabResult | GrabReply  # a reply: already_grabbed by another attempt, not yet settled


class RedisStateStrategy(GrabStrategy):
    """A grab is decided by one Lua script in Redis, then written to MySQL before the answer."""

    rebuildable = True
    uses_redis = True
    # How lua/grab.lua takes a packet: "pop" a pre-split one, or "draw" the amount.
    takes: ClassVar[str] = "pop"
    batched = True  # False: one grab per round trip (the seeds' way)
    # A mark in Redis is a final grab (redis_queue_async: it is in the persist stream), so
    # `already_grabbed` is answered from it; else only once MySQL holds the row.
    marks_are_final: ClassVar[bool] = False
    raw_batch: Callable[..., None] | None = staticmethod(write_grabs_raw)

    @cached_property
    def combiner(self) -> Combiner[Member, Decision]:
        return Combiner(
            self.decide_batch,
            cap=lambda: hot.REDPACK_BATCH_MAX,
            gather=lambda: hot.REDPACK_BATCH_GATHER,
        )

    def script_args(self) -> tuple[str, int]:
        """ARGV lua/grab.lua takes before the users: how it takes a packet, and a seed for a
        draw (fresh per script run)."""
        return (self.takes, 0)

    def grab(self, *, activity_id: int, user_id: int) -> GrabResult:
        return self.grab_checking(activity_id, user_id, None)

    def carries_checks(self) -> bool:
        """The request's checks go in the grab script's run (lua/grab.lua), on the Redis the
        checks live on: not when the packet state lives on a cluster (its own slots), or when
        REDPACK_GRAB_CHECKS_IN_SCRIPT is off."""
        return (
            bool(settings.REDPACK_GRAB_CHECKS_IN_SCRIPT) and not settings.REDPACK_REDIS_CLUSTER_URL
        )

    def grab_checked(self, *, activity_id: int, user_id: int, checks: RequestChecks) -> GrabResult:
        return self.grab_checking(activity_id, user_id, checks)

    def grab_checking(
        self, activity_id: int, user_id: int, checks: RequestChecks | None
    ) -> GrabResult:
        attempt = new_attempt()
        give_up = time.monotonic() + DUPLICATE_WAIT_SECONDS
        pause = 0.005
        check = checks_arg(checks)
        while True:
            # A repeated decision (a mark whose row is still being written) checks no more:
            # the request was checked, and counted, once.
            decided = self.decide(activity_id, user_id, attempt, check)
            check = ""
            if isinstance(decided, GrabResult):
                return decided
            held = held_cents(activity_id=activity_id, user_id=user_id)
            if held is not None:
                return GrabResult(Outcome.ALREADY_GRABBED, held)
            if time.monotonic() >= give_up:
                # No write came: the attempt that made the mark lost its reply (and answered
                # outcome_unknown) or died. This one writes it, fenced (adopt).
                return self.adopt(activity_id, user_id, decided, attempt)
            # The first click is still writing MySQL (or giving its packet back): back off, so
            # repeated clicks do not pile queries on the database the first one is waiting for.
            time.sleep(pause)
            pause = min(2 * pause, 0.1)

    def decide(self, activity_id: int, user_id: int, attempt: str, checks: str = "") -> Decision:
        """This attempt's grab, decided in Redis (in a batch when `batched`) and, when won,
        written to MySQL; `checks` (request_checks.checks_arg): the request's, made first, in
        the same script run (RequestRefused when they fail)."""
        if self.batched:
            return self.combiner.submit(activity_id, (user_id, attempt, checks))
        (decided,) = self.decide_batch(activity_id, [(user_id, attempt, checks)])
        if isinstance(decided, Exception):
            raise decided
        return decided

    def decide_batch(
        self, activity_id: Hashable, members: list[Member]
    ) -> Sequence[Decision | Exception]:
        """One script run for the batch, one write for its winners, one decision per member.

        A member whose user already holds a grab made by another member of this batch, now
        written, is answered here; one whose grab was made by an attempt outside the batch gets
        the reply, and its own call settles it (`grab`)."""
        assert isinstance(activity_id, int)
        replies = run_grabs(self.state_keys(activity_id), members, *self.script_args())
        won = [
            Won(user_id, attempt, reply.mark or "", reply.epoch or "")
            for (user_id, attempt, _), reply in zip(members, replies, strict=True)
            if reply.outcome == "grabbed"
        ]
        answers = self.write(activity_id, won) if won else []
        written = dict(zip((w.attempt for w in won), answers, strict=True))
        # Users holding a grab made outside this batch: their rows, in one query (the write
        # above comes first: a row it just wrote counts).
        elsewhere = [
            user_id
            for (user_id, _, _), reply in zip(members, replies, strict=True)
            if reply.outcome == "already_grabbed" and reply.holder not in written
        ]
        if self.marks_are_final:
            elsewhere = []
        held: dict[int, int] = {}
        if elsewhere:
            try:
                held = self.held_rows(activity_id, elsewhere)
            except DatabaseError:
                logger.warning("activity %s: grabs held elsewhere not looked up", activity_id)
                # Each of those members asks again on its own (`grab`); the others' answers,
                # grabs written above among them, do not depend on it.
        # A winner not written gave its packet back: the batch's `sold_out` answers counted on
        # it being gone, so they become "try again".
        given_back = any(
            not (isinstance(a, GrabResult) and a.outcome is Outcome.GRABBED) for a in answers
        )
        decisions: list[Decision | Exception] = []
        for (user_id, attempt, _), reply in zip(members, replies, strict=True):
            if reply.outcome in REFUSALS:
                decisions.append(refused(reply.outcome, reply.mark))
            elif reply.outcome == "grabbed":
                decisions.append(written[attempt])
            elif reply.outcome == "sold_out" and given_back:
                decisions.append(GrabResult(Outcome.CONTENDED))
            elif reply.outcome != "already_grabbed" or self.marks_are_final:
                decisions.append(self.answer(reply, activity_id))
            elif user_id in held:
                decisions.append(GrabResult(Outcome.ALREADY_GRABBED, held[user_id]))
            elif (first := written.get(reply.holder or "")) is not None and (
                isinstance(first, GrabResult) and first.outcome is Outcome.GRABBED
            ):
                cents = parse_mark(reply.mark or "")[0]
                decisions.append(GrabResult(Outcome.ALREADY_GRABBED, cents))
            else:
                decisions.append(reply)
        return decisions

    def held_rows(self, activity_id: int, user_ids: list[int]) -> dict[int, int]:
        """user -> cents of the grabs MySQL holds for these users (a mark is answered
        `already_grabbed` once its row is there)."""
        return {
            user_id: row.cents
            for user_id, row in held_marks(activity_id=activity_id, user_ids=user_ids).items()
        }

    def write(self, activity_id: int, won: list[Won]) -> list[GrabResult | Exception]:
        """Write the grabs a script run made to MySQL before they are answered (rows.py)."""
        return write_grabs(activity_id=activity_id, grabs=won)

    def holders(self, *, activity_id: int, at_most: int) -> Holders:
        """The marks in Redis; unless they are final, only those whose row MySQL holds are
        settled (the others are still being written, or given back)."""
        grabbed = f"{Keys(activity_id).tag}grabbed"
        client = redis_client()
        if int(client.hlen(grabbed)) > at_most:  # type: ignore[arg-type]
            raise TooMany(grabbed)
        held: dict[bytes, bytes] = client.hgetall(grabbed)  # type: ignore[assignment]
        marks = {
            int(user): parse_mark(split_held(value.decode())[0])[0] for user, value in held.items()
        }
        if self.marks_are_final:
            return Holders(marks)
        rows = {user: row.cents for user, row in held_marks(activity_id=activity_id).items()}
        return Holders(rows, frozenset(marks.keys() - rows.keys()))

    def state_keys(self, activity_id: int) -> list[str]:
        """The KEYS every script of this strategy gets."""
        return Keys(activity_id).ordered()

    def prepare(self, activity: Activity) -> None:
        """Write the Redis state once the send commits; prepare() runs inside that transaction."""
        takes_writes(redis_client())  # Redis away or refusing: fail the send, not its grabs
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

        shards.on_commit(install)

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

    def state_lost(self) -> str | None:
        """presence.py: one read while every open activity's state is in Redis."""
        return state_lost(strategies=[n for n in registry.names() if registry.get(n).rebuildable])

    def run_grab(self, activity_id: int, user_id: int, attempt: str) -> GrabReply:
        """Run the grab script for one attempt alone (keys.run_grabs settles a lost reply)."""
        (reply,) = run_grabs(
            self.state_keys(activity_id), [(user_id, attempt, "")], *self.script_args()
        )
        return reply

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
            with shards.atomic():
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
