"""Whether Redis still holds the state of the open activities: a Redis restarted without its
data (fakeredis, or a server without persistence) holds none, and their grabs answer
`contended` until `manage.py redis_rebuild`.

One key, PRESENT_KEY, says "every open activity's state was seen here". A Redis that lost its
data lost it too, so while it is there the check is one read. When it is missing, the meta keys
of the open activities are looked up (the newest CHECKED_AT_MOST, in one pipeline): all there
(a fresh Redis, or after a rebuild), the key is written; any missing, their ids are the answer.
An activity sent later writes its own state, so the key stays true until Redis loses its data.
"""

from collections.abc import Collection

from redpack import selectors, shards

from ..lua import redis_client
from .keys import Keys

PRESENT_KEY = "rp:state:present"
CHECKED_AT_MOST = 1000


def state_lost(*, strategies: Collection[str]) -> str | None:
    """Why open activities of these strategies have no state in Redis, or None."""
    client = redis_client()
    if client.exists(PRESENT_KEY):
        return None
    ids = [
        pk
        for _ in shards.each()
        for pk in selectors.activities_with_live_state(strategies=strategies).values_list(
            "pk", flat=True
        )[:CHECKED_AT_MOST]
    ]
    pipeline = client.pipeline(transaction=False)
    for activity_id in ids:
        pipeline.exists(Keys(activity_id).meta)
    found = pipeline.execute() if ids else []
    missing = [a for a, there in zip(ids, found, strict=True) if not there]
    if not missing:
        client.set(PRESENT_KEY, "1")
        return None
    shown = ", ".join(str(a) for a in missing[:10]) + (", …" if len(missing) > 10 else "")
    return (
        f"Redis holds no state for {len(missing)} open activities ({shown}): their grabs answer "
        "contended until `manage.py redis_rebuild`"
    )
