"""Dependencies by role: the service's own are what it needs to serve; the lab, `make run` and
development bring theirs as extras, and each image and Makefile target asks for its own."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_service_needs_none_of_the_tools():
    core = names(PROJECT["dependencies"])
    assert core.isdisjoint({"locust", "matplotlib", "psutil", "honcho", "fakeredis", "pytest"})
    assert {"django", "djangorestframework", "celery", "redis", "gunicorn"} <= core


def test_each_role_has_its_extra():
    extras = {name: names(reqs) for name, reqs in PROJECT["optional-dependencies"].items()}
    assert {"locust", "matplotlib", "psutil"} <= extras["lab"]
    assert {"honcho", "fakeredis"} <= extras["run"]
    assert extras["mysql"] == {"mysqlclient"}
    assert "redpack" in extras["dev"]  # the other extras, plus the test and lint tools


def test_the_makefile_installs_what_each_target_needs():
    makefile = (ROOT / "Makefile").read_text()
    targets = dict(re.findall(r"^(run|test|compare): (\S+)", makefile, re.MULTILINE))
    assert targets["test"].endswith(".installed-dev")
    assert "RUN_EXTRAS" in targets["run"] and "LAB_EXTRAS" in targets["compare"]
    assert re.search(r"^RUN_EXTRAS := run,lab", makefile, re.MULTILINE)


def test_the_image_carries_the_lab_for_its_locust_processes():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    build = compose["x-app"]["build"]
    assert "lab" in build["args"]["EXTRAS"].split(",")
    assert 'pip install ".[${EXTRAS}]"' in (ROOT / "Dockerfile").read_text()
