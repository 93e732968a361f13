# The two commands a newcomer needs: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
LOCUST_PORT ?= 8089
WEB_WORKERS ?= 2
WEB_THREADS ?= 32
WORKER_CONCURRENCY ?= 2
# Flower (Celery's task monitor) beside the rest: make run FLOWER_PORT=5555. Off when empty.
FLOWER_PORT ?=
# The MySQL driver compiles against the client headers (pkg-config, libmariadb-dev). Without
# them the install leaves it out: `make run` falls back to SQLite, `make test` asks for them.
MYSQL_HEADERS := $(shell pkg-config --exists mysqlclient 2>/dev/null || pkg-config --exists mariadb 2>/dev/null && echo yes)
MYSQL := $(if $(MYSQL_HEADERS),mysql,)
comma := ,
# Dependencies by role (pyproject.toml): each target installs the extras it needs, once per set
# (a marker per set, redone when pyproject.toml changes).
RUN_EXTRAS := run,lab$(if $(MYSQL),$(comma)$(MYSQL),)
LAB_EXTRAS := lab$(if $(MYSQL),$(comma)$(MYSQL),)

.PHONY: run test install lint typecheck clean compare

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip

# .venv/.installed-<extras>: the project with those extras ("core" for none).
$(VENV)/.installed-%: pyproject.toml | $(PY)
	$(if $(MYSQL_HEADERS),,@echo "no MySQL client headers: installing without the MySQL driver (SQLite only)")
	$(VENV)/bin/pip install --quiet -e '.$(if $(filter core,$*),,[$*])'
	touch $@

install: $(VENV)/.installed-$(RUN_EXTRAS)

# A secret key of this checkout's own, written once; DEBUG stays off unless you set it.
.env:
	@echo "SECRET_KEY=$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(50))')" > .env
	@echo "wrote .env with a fresh SECRET_KEY"

# Web, Celery worker, one Celery beat and the Locust UI under honcho (Procfile), on MariaDB and
# Redis when they answer, else on embedded SQLite and Redis: see redpack/launch.py. Ctrl-C stops all.
run: $(VENV)/.installed-$(RUN_EXTRAS) .env
	$(PY) -m redpack.launch run --host $(HOST) --port $(PORT) --locust-port $(LOCUST_PORT) \
		--web-workers $(WEB_WORKERS) --web-threads $(WEB_THREADS) \
		--worker-concurrency $(WORKER_CONCURRENCY) $(if $(FLOWER_PORT),--flower-port $(FLOWER_PORT),)

# The tests talk to the real MariaDB: they need the MySQL driver, hence its headers.
test: $(VENV)/.installed-dev
	$(PY) -m pytest $(PYTEST_ARGS)

# Every strategy through the direct bench and Locust next to this machine's ceilings; writes
# reports/compare.{md,png,json}. Shorter runs: make compare COMPARE_ARGS="--hot-users 2000 ..."
# Inside the image (compose's `compare` profile) the dependencies are there already:
# make compare PY=python LAB_EXTRAS=image -o .venv/.installed-image -o .env
COMPARE_ARGS ?=
compare: $(VENV)/.installed-$(LAB_EXTRAS) .env
	$(PY) manage.py create_database
	$(PY) manage.py migrate --noinput
	$(PY) manage.py compare $(COMPARE_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(VENV)/bin/mypy redpack strategies

clean:
	rm -rf $(VENV) staticfiles .run .pytest_cache .mypy_cache .ruff_cache
