"""Everyday traffic: users send small red packets, grab the recent ones, look at their grabs.

    locust -f locustfiles/mixed.py --users-csv bench-users.csv -u 200 -r 20 -t 5m \\
        --host http://127.0.0.1:8000 --strategy pessimistic

Every activity sent during the run is audited at the end.
"""

import random
from collections import deque

from locust import FastHttpUser, between, task
from locust.exception import StopUser

import _common

_common.register(_common.Scenario("mixed", creates_activity=False))

recent: deque[int] = deque(maxlen=20)  # activities sent by this process's users


class MixedUser(FastHttpUser):
    wait_time = between(0.2, 1.0)

    def on_start(self) -> None:
        identity = _common.lab.take_identity()
        if identity is None:
            raise StopUser()
        self.identity = identity
        self.headers = {"Authorization": identity.authorization}
        self.grabbed_in: set[int] = set()

    @task(1)
    def send(self) -> None:
        options = self.environment.parsed_options
        body = {
            "total_amount": "10.00",
            "total_count": 10,
            "strategy": options.strategy,
            "allocation": options.allocation,
            "expires_in": 3600,
        }
        with self.client.post(
            "/api/activities/", json=body, headers=self.headers, name="send", catch_response=True
        ) as response:
            if response.status_code != 201:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:120]}")
                return
            activity_id = int(response.json()["id"])
        recent.append(activity_id)
        _common.lab.created.append(activity_id)

    @task(6)
    def grab(self) -> None:
        candidates = [a for a in recent if a not in self.grabbed_in]
        if candidates:
            activity_id = random.choice(candidates)
            if _common.grab(self, self.identity, activity_id) != "contended":
                self.grabbed_in.add(activity_id)

    @task(2)
    def my_grabs(self) -> None:
        self.client.get("/api/me/grabs/?limit=20", headers=self.headers, name="me/grabs")

    @task(1)
    def view(self) -> None:
        if recent:
            activity_id = random.choice(recent)
            self.client.get(
                f"/api/activities/{activity_id}/", headers=self.headers, name="activity"
            )
