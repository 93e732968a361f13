"""`python -m tests.paused_grabber <strategy> <activity> <user>...`: a process that runs these
users' grabs as one batch, as the combiner's leader would, and stops inside it once the batch is
decided and not yet committed (group_commit: the activity's row locked, the query that writes
the rows and commits not sent; the Redis strategies: the script ran, MySQL not yet written),
printing "paused", so that a test can SIGKILL it there.

The pause is patched in here, in the test's child process, not configured in production code.
"""

import sys
import time
from typing import Any


def pause(*args: Any, **kwargs: Any) -> None:
    print("paused", flush=True)
    time.sleep(300)


def main() -> None:
    name, activity, *users = sys.argv[1:]
    import django

    django.setup()
    from strategies import group_commit, registry
    from strategies.redis_state import RedisStateStrategy
    from strategies.redis_state.keys import new_attempt
    from strategies.steps import GrabTransaction

    strategy = registry.get(name)
    user_ids = [int(user) for user in users]
    if isinstance(strategy, group_commit.GroupCommitStrategy):
        GrabTransaction.commit_with_grabs = pause  # type: ignore[method-assign]
        strategy.grab_batch(int(activity), user_ids)
    elif isinstance(strategy, RedisStateStrategy):
        RedisStateStrategy.write = pause  # type: ignore[assignment,method-assign]
        strategy.decide_batch(int(activity), [(user, new_attempt(), "") for user in user_ids])
    else:
        raise SystemExit(f"{name} does not batch")


if __name__ == "__main__":
    main()
