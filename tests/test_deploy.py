"""deploy/: the multi-node stack cannot run here (no Docker engine); check what can be checked.

N web replicas behind nginx (which keeps /metrics to the network inside), one beat, several
workers, a six-node Redis Cluster for the strategies with append-only files, MariaDB with a
replica of the primary, distributed Locust, Prometheus scraping each replica, the dashboard.
"""

import json
import re
from pathlib import Path

import yaml

from redpack import launch
from tests.lab.test_docker_compose import commands

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
STACK = yaml.safe_load((DEPLOY / "docker-compose.scale.yml").read_text())
SERVICES: dict = STACK["services"]
APP = {name: s for name, s in SERVICES.items() if s.get("image") == "redpack:latest"}


def replicas(service: dict) -> int:
    value = str(service.get("deploy", {}).get("replicas", 1))
    default = re.fullmatch(r"\$\{\w+:-(\d+)\}", value)
    return int(default.group(1) if default else value)


def test_web_and_workers_scale_and_beat_does_not():
    assert replicas(SERVICES["web"]) >= 2 and replicas(SERVICES["worker"]) >= 2
    beats = [n for n, s in APP.items() if any("beat" in argv for argv in commands(s))]
    assert beats == ["beat"] and replicas(SERVICES["beat"]) == 1
    assert replicas(SERVICES["locust-worker"]) >= 2
    for name, service in SERVICES.items():
        if service.get("restart") != "no":
            assert service["healthcheck"]["test"], name


def test_nginx_balances_the_web_replicas_and_keeps_metrics_inside():
    conf = (DEPLOY / "nginx.conf").read_text()
    assert re.search(r"upstream web \{[^}]*server web:8000", conf)
    assert re.search(r"location = /metrics \{\s*return 404;", conf)
    assert "proxy_pass http://web;" in conf
    # nginx's own 502 and 504 answer JSON with Retry-After, as the app's 503 does: a grab
    # hears outcome_unknown, anything else unavailable (a send: look before repeating it).
    for status, where in ((502, "@bad_gateway"), (504, "@gateway_timeout")):
        assert f"error_page {status} {where};" in conf
        block = re.search(rf"location {where} \{{(.*?)\n        \}}", conf, re.S)
        assert block, where
        assert "add_header Retry-After 1 always;" in block[1]
        assert f"return {status} $gateway_failed;" in block[1]
    assert 'map "$request_method $uri" $gateway_failed {' in conf
    bodies = dict(re.findall(r"^ +(\S+|\"[^\"]+\") '(\{.*\})';$", conf, re.M))
    codes = {match: json.loads(body)["error"]["code"] for match, body in bodies.items()}
    assert codes == {
        '"~^POST /api/activities/[0-9]+/grab/?$"': "outcome_unknown",
        '"~^(GET|HEAD|OPTIONS) "': "unavailable",
        "default": "unavailable",
    }
    assert "look before repeating it" in bodies["default"]
    network = STACK["networks"]["redpack"]["ipam"]["config"][0]["subnet"]
    for service in APP.values():
        assert service["environment"]["REDPACK_METRICS_NETWORKS"] == network
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (web_job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "redpack-web"]
    assert web_job["dns_sd_configs"][0]["names"] == ["web"]


def test_the_strategies_keep_their_state_in_a_redis_cluster_with_append_only_files():
    nodes = [name for name in SERVICES if name.startswith("redis-node-")]
    assert len(nodes) == 6
    for name in nodes:
        command = SERVICES[name]["command"]
        assert "--cluster-enabled" in command
        assert command[command.index("--appendfsync") + 1] == "everysec"
    create = " ".join(SERVICES["redis-cluster"]["command"])
    assert "--cluster-replicas 1" in create and all(f"{n}:7000" in create for n in nodes)
    for service in APP.values():
        assert service["environment"]["REDPACK_REDIS_CLUSTER_URL"].startswith("redis://redis-node")


def test_mariadb_has_a_replica_of_the_primary():
    primary, replica = SERVICES["mariadb-primary"], SERVICES["mariadb-replica"]
    assert "--log-bin=mariadb-bin" in primary["command"]
    assert replica["environment"]["MARIADB_MASTER_HOST"] == "mariadb-primary"
    assert "--read-only=ON" in replica["command"]
    for service in APP.values():
        assert "@mariadb-primary:3306/" in service["environment"]["DATABASE_URL"]


def test_the_shards_profile_adds_two_primaries_the_app_is_pointed_at_by_redpack_shards():
    shard_dbs = {n: s for n, s in SERVICES.items() if n.startswith("mariadb-shard")}
    assert sorted(shard_dbs) == ["mariadb-shard0", "mariadb-shard1"]
    for number, (name, service) in enumerate(sorted(shard_dbs.items())):
        assert service["profiles"] == ["shards"]
        assert service["environment"]["MARIADB_DATABASE"] == f"redpack_s{number}"
        assert service["volumes"] == [f"{name}:/var/lib/mysql"]
    for service in APP.values():
        assert service["environment"]["REDPACK_SHARDS"] == "${REDPACK_SHARDS:-}"


def test_locust_is_distributed_with_make_runs_scenario_through_the_balancer():
    (master,) = commands(SERVICES["locust-master"])
    (worker,) = commands(SERVICES["locust-worker"])
    assert master[master.index("-f") + 1] == worker[worker.index("-f") + 1] == launch.LOCUSTFILE
    assert master[master.index("--host") + 1] == "http://nginx:8000"


def test_secrets_have_no_defaults_and_grafana_gets_the_dashboard():
    text = (DEPLOY / "docker-compose.scale.yml").read_text()
    for secret in ("SECRET_KEY", "MARIADB_ROOT_PASSWORD", "MARIADB_REPLICATION_PASSWORD"):
        assert not re.search(rf"\$\{{{secret}:-", text) and f"${{{secret}:?" in text
    mounts = " ".join(SERVICES["grafana"]["volumes"])
    assert "./grafana-dashboard.json:" in mounts and (DEPLOY / "grafana-dashboard.json").exists()
