# The two commands a newcomer needs: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
WEB_WORKERS ?= 2
WEB_THREADS ?= 8

.PHONY: run test install lint typecheck clean compare

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# A secret key of this checkout's own, written once; DEBUG stays off unless you set it.
.env:
	@echo "SECRET_KEY=$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(50))')" > .env
	@echo "wrote .env with a fresh SECRET_KEY"

run: install .env
	$(PY) manage.py create_database
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py create_demo_admin --username admin --password admin
	@echo ""
	@echo "  admin     http://$(HOST):$(PORT)/admin/   (log in as admin / admin)"
	@echo "  API docs  http://$(HOST):$(PORT)/api/docs/"
	@echo "  API       http://$(HOST):$(PORT)/api/   (token: POST /api/token/ with username and password)"
	@echo "  health    http://$(HOST):$(PORT)/healthz"
	@echo ""
	$(VENV)/bin/gunicorn redpack.wsgi:application --bind $(HOST):$(PORT) \
		--workers $(WEB_WORKERS) --threads $(WEB_THREADS) --access-logfile -

test: install
	$(PY) -m pytest

# Every strategy through the direct bench and Locust next to this machine's ceilings; writes
# reports/compare.{md,png,json}. Shorter runs: make compare COMPARE_ARGS="--hot-users 2000 ..."
COMPARE_ARGS ?=
compare: install .env
	$(PY) manage.py create_database
	$(PY) manage.py migrate --noinput
	$(PY) manage.py compare $(COMPARE_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy redpack strategies

clean:
	rm -rf $(VENV) staticfiles .pytest_cache .mypy_cache .ruff_cache
