"""Seed 002's case: one large activity grabbed as fast as possible.

    locust -f locustfiles/throughput.py --users-csv bench-users.csv -u 64 -r 64 -t 60s \\
        --host http://127.0.0.1:8000 --strategy pessimistic --packets 100000

`-u` users grab back to back, each click with the next unused bench user, so every request
is a first grab of its user. Needs REDPACK_MAX_COUNT >= --packets on the server, and as many
bench users as grabs you want to fire; users stop when the CSV runs out.
"""

from locust import FastHttpUser, task
from locust.exception import StopUser

import _common

_common.register(_common.Scenario("throughput", packets=100_000))


class ThroughputGrabber(FastHttpUser):
    @task
    def grab_next(self) -> None:
        identity = _common.lab.take_identity()
        if identity is None:
            _common.user_finished(self.environment)
            raise StopUser()
        _common.grab(self, identity, _common.lab.activity_id)
