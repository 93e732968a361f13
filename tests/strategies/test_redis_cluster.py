"""The Redis strategies on a real Redis Cluster: three masters this module starts on loopback."""

import random
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
from django_redis import get_redis_connection
from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from redpack import services
from strategies import registry
from strategies.base import Outcome
from strategies.lua import redis_client
from strategies.redis_queue_async import persister, stream
from strategies.redis_state.keys import Keys
from tests.contract.harness import check_close_stops_grabs, check_double_clicks, grab_concurrently

REDIS_STRATEGIES = ["redis_queue", "redis_counter", "redis_queue_async"]
MASTERS = 3
BUS_OFFSET = 10000  # a cluster node also listens on its port + 10000 for the cluster bus


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """Ports free now, each with its bus port free too (others may run a cluster as well)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(20000, 30000)
        if port not in ports and _bindable(port) and _bindable(port + BUS_OFFSET):
            ports.append(port)
    return ports


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        try:
            if condition():
                return
        except RedisConnectionError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start the masters, join them with `redis-cli --cluster create`, stop them at the end."""
    workdir = tmp_path_factory.mktemp("redis-cluster")
    ports = _free_ports(MASTERS)
    servers: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            servers.append(
                subprocess.Popen(
                    [
                        "redis-server",
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        f"nodes-{port}.conf",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(workdir),
                        "--logfile",
                        str(workdir / f"redis-{port}.log"),
                    ],
                )
            )
        nodes = [Redis(port=port) for port in ports]
        for node in nodes:
            _wait_for(node.ping, f"redis-server on port {node.get_connection_kwargs()['port']}")
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{port}" for port in ports],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for node in nodes:
            _wait_for(
                lambda node=node: node.execute_command("CLUSTER INFO")["cluster_state"] == "ok",
                "cluster_state:ok",
            )
        yield f"redis://127.0.0.1:{ports[0]}"
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)


@pytest.fixture
def on_cluster(redis_cluster: str, settings) -> RedisCluster:  # type: ignore[no-untyped-def]
    """The strategies keep their state in the cluster for this test (settings swap the client)."""
    settings.REDPACK_REDIS_CLUSTER_URL = redis_cluster
    client = redis_client()
    assert isinstance(client, RedisCluster)
    client.flushdb()  # every master
    return client


def _assert_state_lives_in_one_slot(client: RedisCluster, strategy: str, activity_id: int) -> None:
    keys = registry.get(strategy).state_keys(activity_id)
    present = [key for key in keys if client.exists(key)]
    assert Keys(activity_id).tag + "meta" in present
    assert len({client.keyslot(key) for key in keys}) == 1
    assert not get_redis_connection("default").exists(*keys)  # not in the single Redis


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", REDIS_STRATEGIES)
def test_contract_on_cluster(strategy, on_cluster, make_users, sender):
    activity = check_double_clicks(strategy, make_users, sender)
    _assert_state_lives_in_one_slot(on_cluster, strategy, activity.pk)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", REDIS_STRATEGIES)
def test_close_on_cluster(strategy, on_cluster, make_users, sender):
    activity = check_close_stops_grabs(strategy, make_users, sender)
    _assert_state_lives_in_one_slot(on_cluster, strategy, activity.pk)


@pytest.mark.django_db(transaction=True)
def test_persister_on_cluster(on_cluster, make_users, sender):
    """The index lives in another slot than the streams: the runs and the lag work across."""
    activities = [
        services.activity_send(
            sender_id=sender.pk,
            total_amount="10.00",
            total_count=10,
            strategy="redis_queue_async",
            expires_in=3600,
        )
        for _ in range(3)
    ]
    users = make_users(8)
    answered = 0
    for activity in activities:
        answers = grab_concurrently(activity.pk, [u.pk for u in users], clicks_per_user=1)
        answered += sum(a.result.outcome is Outcome.GRABBED for a in answers)
    assert sorted(stream.registered()) == sorted(a.pk for a in activities)
    assert stream.lag()["pending"] == answered == 24
    assert persister.persist_all(run_seconds=30) == 24
    assert stream.lag() == {"pending": 0, "oldest_age_seconds": 0.0}
    for activity in activities:
        registry.get("redis_queue_async").close(activity_id=activity.pk)
    persister.reclaim_all(min_idle_seconds=0, run_seconds=30)
    assert stream.registered() == []


def test_the_cluster_client_has_the_timeouts_and_resends_nothing(on_cluster, settings):
    assert on_cluster.retry.get_retries() == 0  # a lost reply is settled by the strategy
    node = on_cluster.get_default_node().redis_connection
    kwargs = node.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == settings.REDIS_SOCKET_TIMEOUT
    assert kwargs["socket_connect_timeout"] == settings.REDIS_CONNECT_TIMEOUT
