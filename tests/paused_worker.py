"""`python -m tests.paused_worker <point>:<seconds> <celery arguments>`: a Celery worker whose
persister (or crediting task) stops at a point of every batch for that long, so that a test can
SIGKILL it there.

- before_commit: the batch's rows are written, its transaction is not yet committed.
- before_ack: the batch is committed, its entries have not yet left the stream.
- credit_before_commit: the crediting task's entries, lines and balances are written, its
  transaction is not yet committed.

The pause is patched in here, in the test's own process, not configured in production code.
"""

import sys
import time
from collections.abc import Callable
from typing import Any


def paused(run: Callable[..., Any], seconds: float, *, after: bool) -> Callable[..., Any]:
    def pausing(*args: Any, **kwargs: Any) -> Any:
        if not after:
            time.sleep(seconds)
        result = run(*args, **kwargs)
        if after:
            time.sleep(seconds)
        return result

    return pausing


def main() -> None:
    point, _, seconds = sys.argv[1].partition(":")
    import django

    django.setup()
    from celery.__main__ import main as celery_main

    from redpack import ledger
    from strategies.redis_queue_async import persister, stream

    if point == "before_commit":
        persister._insert = paused(persister._insert, float(seconds), after=True)
    elif point == "before_ack":
        stream.acknowledge = paused(stream.acknowledge, float(seconds), after=False)
    elif point == "credit_before_commit":
        ledger._post_credits = paused(ledger._post_credits, float(seconds), after=True)
    else:
        raise SystemExit(f"unknown pause point {point!r}")
    sys.argv = ["celery", *sys.argv[2:]]
    celery_main()


if __name__ == "__main__":
    main()
