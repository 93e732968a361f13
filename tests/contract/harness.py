"""Drive any strategy with many concurrent grabbers, each clicking twice at once."""

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection

from redpack import services
from strategies.base import GrabResult

CONNECT_AT_ONCE = 16


@dataclass(frozen=True)
class Answer:
    user_id: int
    result: GrabResult


def grab_concurrently(
    activity_id: int, user_ids: Sequence[int], clicks_per_user: int = 2
) -> list[Answer]:
    """Start every click on one barrier, each in its own thread with its own DB connection."""
    clicks = [user_id for user_id in user_ids for _ in range(clicks_per_user)]
    barrier = threading.Barrier(len(clicks))
    # Connections are opened before the barrier, a few at a time: a burst of hundreds of
    # connects overflows the server's listen backlog, and the grabs are what is under test.
    connecting = threading.BoundedSemaphore(CONNECT_AT_ONCE)
    answers: list[Answer] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def click(user_id: int) -> None:
        try:
            with connecting:
                connection.ensure_connection()
            barrier.wait(timeout=120)
            result = services.grab(activity_id=activity_id, user_id=user_id)
            with lock:
                answers.append(Answer(user_id, result))
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised by the caller
            with lock:
                errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=click, args=(u,)) for u in clicks]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 300
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    assert len(answers) == len(clicks), "some grabbers never answered"
    return answers
