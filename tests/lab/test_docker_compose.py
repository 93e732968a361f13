"""docker-compose.yml cannot run here (no Docker engine): check what can be checked.

Valid YAML; every long-running service has a healthcheck, and the stores are waited for; every
app service gets the `make run` variables; every command it names exists (manage.py commands,
`celery -A redpack` and its subcommand, Locust files, the gunicorn WSGI module, Makefile
targets); exactly one beat; secrets only from the environment.

And compose equals `make run`: the processes of the Procfile with the Makefile's defaults
(workers, threads, concurrency, flags), the Locust scenario redpack/launch.py names, Redis with
an append-only file fsync'ed every second (what the embedded Redis of `make run` runs with),
and the same preparation (database, schema, demo admin, bench users, demo activities).
"""

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands

from redpack import launch

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict = COMPOSE["services"]
APP = {name: s for name, s in SERVICES.items() if s.get("build")}
REQUIRED_ENV = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY"}
ONE_SHOT = {"setup", "compare"}
SECRETS = ("SECRET_KEY", "MARIADB_ROOT_PASSWORD", "DEMO_ADMIN_PASSWORD")
PROCFILE = dict(
    line.split(": ", 1)
    for line in (REPO / "Procfile").read_text().splitlines()
    if line and not line.startswith("#")
)
MAKEFILE = (REPO / "Makefile").read_text()


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


def test_every_long_running_service_has_a_healthcheck_and_app_services_wait_for_stores():
    for name, service in SERVICES.items():
        if name not in ONE_SHOT:
            assert service["healthcheck"]["test"], name
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
            assert argv[3] in {"worker", "beat", "flower"}, argv
        elif program == "locust":
            locustfile = argv[argv.index("-f") + 1]
            assert (REPO / locustfile).is_file(), locustfile
            assert "--master" in argv or "--worker" in argv
        elif program == "make":
            assert re.search(rf"^{argv[1]}:", MAKEFILE, re.MULTILINE), argv
        elif program == "gunicorn":
            module, attribute = argv[1].split(":")
            assert callable(getattr(importlib.import_module(module), attribute))
        else:
            pytest.fail(f"{name}: unchecked program {program!r}")


def test_locust_workers_can_be_scaled():
    worker = SERVICES["locust-worker"]
    assert "ports" not in worker and "container_name" not in worker
    assert "--master-host" in worker["command"]


def test_secrets_come_from_the_environment_with_no_default():
    """Compose refuses to start without them (`${VAR:?…}`) rather than using a value everybody
    can read here: the token signing key, the database password, the demo admin's password."""
    text = (REPO / "docker-compose.yml").read_text()
    for secret in SECRETS:
        uses = re.findall(rf"\$\{{{secret}(\S?)", text)
        assert uses and set(uses) == {":"}, (secret, uses)
        assert not re.search(rf"\$\{{{secret}:-", text), secret
    for service in APP.values():
        assert service["environment"]["SECRET_KEY"].startswith("${SECRET_KEY:?")


def test_ports_listen_on_loopback_unless_told_otherwise():
    published = [port for service in SERVICES.values() for port in service.get("ports", [])]
    assert published
    for port in published:
        assert str(port).startswith("${BIND_ADDRESS:-127.0.0.1}:"), port


def test_the_demo_admin_password_is_chosen_by_whoever_starts_it():
    """create_demo_admin makes the user once and never resets it (tests/management)."""
    setup = " ".join(SERVICES["setup"]["command"])
    assert 'create_demo_admin --username admin --password "$$DEMO_ADMIN_PASSWORD"' in setup
    assert SERVICES["setup"]["environment"]["DEMO_ADMIN_PASSWORD"].startswith(
        "${DEMO_ADMIN_PASSWORD:?"
    )


def makefile_default(name: str) -> str:
    found = re.search(rf"^{name} \?= (\S+)$", MAKEFILE, re.MULTILINE)
    assert found, name
    return found.group(1)


def procfile_argv(process: str) -> list[str]:
    """The Procfile's command of `process` with `make run`'s values (the Makefile's defaults,
    as redpack/launch.py passes them on), the addresses left as variables."""
    defaults = launch.run_environment(
        launch.Backends("db", "redis", "broker", "", ""),
        argparse.Namespace(
            host="$HOST",
            port="$PORT",
            locust_port="$LOCUST_PORT",
            flower_port="$FLOWER_PORT",
            web_workers=makefile_default("WEB_WORKERS"),
            web_threads=makefile_default("WEB_THREADS"),
            worker_concurrency=makefile_default("WORKER_CONCURRENCY"),
        ),
    )
    line = re.sub(r"\$(\w+)", lambda m: defaults.get(m.group(1), m.group(0)), PROCFILE[process])
    return shlex.split(line)


def options(argv: list[str], *names: str) -> dict[str, str]:
    """The values of these --options in argv (either `--name value` or `--name=value`)."""
    found = {}
    for index, arg in enumerate(argv):
        key, equals, value = arg.partition("=")
        if key in names:
            found[key] = value if equals else argv[index + 1]
    return found


def test_the_launcher_defaults_are_the_makefiles():
    """`python -m redpack.launch run` without the Makefile starts the same server."""
    source = Path(launch.__file__).read_text()
    for name in ("WEB_WORKERS", "WEB_THREADS", "WORKER_CONCURRENCY"):
        option = "--" + name.lower().replace("_", "-")
        found = re.search(rf'"{option}", type=int, default=(\d+)', source)
        assert found and found.group(1) == makefile_default(name), name


def test_compose_runs_the_procfile_processes_with_make_runs_settings():
    everything = launch.chosen_processes(
        launch.Backends("db", "redis", "broker", "", ""),
        argparse.Namespace(flower_port=5555),
        with_locust=True,
    )
    assert set(everything) == {"web", "worker", "beat", "locust", "flower"} <= set(PROCFILE)
    (web,) = commands(SERVICES["web"])
    procfile_web = procfile_argv("web")
    flags = ("--workers", "--threads", "--access-logfile")
    assert web[:2] == procfile_web[:2] == ["gunicorn", "redpack.wsgi:application"]
    assert options(web, *flags) == options(procfile_web, *flags)
    assert commands(SERVICES["worker"]) == [procfile_argv("worker")]
    (beat,) = commands(SERVICES["beat"])
    procfile_beat = procfile_argv("beat")
    assert beat[: beat.index("--schedule")] == procfile_beat[: procfile_beat.index("--schedule")]
    (flower,) = commands(SERVICES["flower"])
    assert flower[:4] == procfile_argv("flower")[:4] == ["celery", "-A", "redpack", "flower"]
    assert SERVICES["flower"]["profiles"] == ["flower"]
    for service in ("locust-master", "locust-worker"):
        (locust,) = commands(SERVICES[service])
        assert options(locust, "-f") == options(procfile_argv("locust"), "-f")
        assert options(locust, "-f")["-f"] == launch.LOCUSTFILE


def test_redis_keeps_an_append_only_file_as_make_runs_does():
    command = SERVICES["redis"]["command"]
    assert options(command, "--appendonly", "--appendfsync") == {
        "--appendonly": "yes",
        "--appendfsync": "everysec",
    }
    assert "redis:/data" in SERVICES["redis"]["volumes"]
    source = Path(launch.__file__).read_text()
    assert '"--appendonly", "yes"' in source  # the embedded redis-server of `make run`


def test_setup_prepares_what_make_run_prepares():
    steps = [argv[2] for argv in commands(SERVICES["setup"])]
    source = Path(launch.__file__).read_text()
    made_by_make_run = re.findall(r'command\("(\w+)"', source)
    assert set(made_by_make_run) - {"collectstatic"} <= set(steps), made_by_make_run
    assert "seed_demo" in steps and steps.index("migrate") < steps.index("seed_demo")


def test_the_compare_profile_runs_make_compare_and_its_report_reaches_the_admin():
    compare = SERVICES["compare"]
    assert compare["profiles"] == ["compare"]
    (argv,) = commands(compare)
    assert argv[:2] == ["make", "compare"]
    assert "reports:/app/reports" in compare["volumes"]
    assert "reports:/app/reports" in SERVICES["web"]["volumes"]


def test_the_image_leaves_out_local_state_but_keeps_the_published_comparison():
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".run", ".venv*", "reports"} <= set(ignored)
    assert "!reports/compare.json" in ignored  # the admin's "Latest comparison"
