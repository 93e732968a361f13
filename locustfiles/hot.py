"""Seed 000's case: 10,000 users, 100 packets, everybody at once.

    locust -f locustfiles/hot.py --users-csv bench-users.csv -u 10000 -r 10000 \\
        --host http://127.0.0.1:8000 --strategy pessimistic

Each Locust user is one bench user; it waits until every user is spawned, grabs once (or
`--clicks` times at the same moment), and is done. The test stops when all users are done.
"""

import gevent
from locust import FastHttpUser, task
from locust.exception import StopUser

import _common

_common.register(_common.Scenario("hot", packets=100, burst=True))


class HotGrabber(FastHttpUser):
    def on_start(self) -> None:
        self.identity = _common.lab.take_identity()

    @task
    def grab_once(self) -> None:
        if self.identity is not None:
            _common.lab.gate.wait()  # released when the last user is spawned
            clicks = max(1, self.environment.parsed_options.clicks)
            activity_id = _common.lab.activity_id
            gevent.joinall(
                [
                    gevent.spawn(_common.grab, self, self.identity, activity_id)
                    for _ in range(clicks)
                ]
            )
        _common.user_finished(self.environment)
        raise StopUser()
