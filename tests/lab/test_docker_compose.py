"""docker-compose.yml cannot run here (no Docker engine): check what can be checked.

Valid YAML; MariaDB and Redis have healthchecks and are waited for; every app service gets
the `make run` variables; every command it names exists (manage.py commands, `celery -A
redpack` and its subcommand, Locust files, the gunicorn WSGI module); exactly one beat.
"""

import importlib
import re
import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict = COMPOSE["services"]
APP = {name: s for name, s in SERVICES.items() if s.get("build")}
REQUIRED_ENV = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY"}


def interpolated(text: str) -> str:
    """Compose's ${VAR:-default}, taking the default (the value without any .env)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def commands(service: dict) -> list[list[str]]:
    """The service's command as argv lists; `sh -c "a && b"` gives one list per step."""
    command = service.get("command")
    if command is None:
        return []
    argv = [
        interpolated(a) for a in (command if isinstance(command, list) else shlex.split(command))
    ]
    if argv[:2] == ["sh", "-c"]:
        return [shlex.split(step) for step in argv[2].split("&&")]
    return [argv]


def test_stores_have_healthchecks_and_app_services_wait_for_them():
    for store in ("mariadb", "redis"):
        assert SERVICES[store]["healthcheck"]["test"]
    assert "noeviction" in SERVICES["redis"]["command"]
    for name, service in APP.items():
        depends = service.get("depends_on", {})
        if name.startswith("locust"):
            continue  # they wait for the web server, which waits for the stores
        for store in ("mariadb", "redis"):
            assert depends[store]["condition"] == "service_healthy", name


def test_app_services_get_the_same_variables_as_make_run():
    assert {"setup", "web", "worker", "beat", "locust-master", "locust-worker"} <= set(APP)
    for name, service in APP.items():
        assert set(service["environment"]) >= REQUIRED_ENV, name
        assert service["build"]["context"] == "."
    assert (REPO / "Dockerfile").exists()


def test_exactly_one_beat_and_it_is_not_scaled():
    def runs_beat(service: dict) -> bool:
        return any(argv[:1] == ["celery"] and "beat" in argv for argv in commands(service))

    assert [name for name, service in APP.items() if runs_beat(service)] == ["beat"]
    assert SERVICES["beat"].get("deploy", {}).get("replicas", 1) == 1


@pytest.mark.parametrize("name", sorted(APP))
def test_every_command_exists(name):
    known = get_commands()
    for argv in commands(APP[name]):
        program = argv[0]
        if program == "python":
            assert argv[1] == "manage.py" and (REPO / "manage.py").exists()
            assert argv[2] in known, f"{name}: no manage.py command {argv[2]!r}"
        elif program == "celery":
            assert argv[1:3] == ["-A", "redpack"]
            assert importlib.import_module("redpack.celery").app.main == "redpack"
            assert argv[3] in {"worker", "beat"}, argv
        elif program == "locust":
            locustfile = argv[argv.index("-f") + 1]
            assert (REPO / locustfile).is_file(), locustfile
            assert "--master" in argv or "--worker" in argv
        elif program == "gunicorn":
            module, attribute = argv[1].split(":")
            assert callable(getattr(importlib.import_module(module), attribute))
        else:
            pytest.fail(f"{name}: unchecked program {program!r}")


def test_locust_workers_can_be_scaled():
    worker = SERVICES["locust-worker"]
    assert "ports" not in worker and "container_name" not in worker
    assert "--master-host" in worker["command"]


def test_no_default_secret_key():
    """Compose refuses to start without SECRET_KEY (`${SECRET_KEY:?…}`) rather than signing
    tokens with a key everybody can read here."""
    for service in APP.values():
        value = service["environment"]["SECRET_KEY"]
        assert value.startswith("${SECRET_KEY:?"), value


def test_ports_listen_on_loopback_unless_told_otherwise():
    published = [port for service in SERVICES.values() for port in service.get("ports", [])]
    assert published
    for port in published:
        assert str(port).startswith("${BIND_ADDRESS:-127.0.0.1}:"), port


def test_the_demo_admin_password_can_be_chosen():
    """create_demo_admin makes the user once and never resets it (tests/management)."""
    setup = " ".join(SERVICES["setup"]["command"])
    assert 'create_demo_admin --username admin --password "${DEMO_ADMIN_PASSWORD:-admin}"' in setup
