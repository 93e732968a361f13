"""The web server's ceiling: GET /api/ping/, authenticated like a grab, doing nothing else.

    locust -f locustfiles/ping.py --users-csv bench-users.csv -u 64 -r 64 -t 30s \\
        --host http://127.0.0.1:8000

`make compare` divides each strategy's HTTP throughput by this rate.
"""

import time

from locust import FastHttpUser, task

import _common

_common.register(_common.Scenario("ping", creates_activity=False))


class Pinger(FastHttpUser):
    def on_start(self) -> None:
        self.headers = {"Authorization": _common.lab.sender.authorization}

    @task
    def ping(self) -> None:
        began = time.time()
        lab = _common.lab
        lab.first_start = began if lab.first_start is None else min(lab.first_start, began)
        self.client.get("/api/ping/", headers=self.headers, name="ping")
        lab.last_end = time.time()
