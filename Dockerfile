# One image for every process of docker-compose.yml: web (gunicorn), Celery worker and beat,
# Locust master and workers, and the one-shot setup (migrate, demo admin, bench users).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# mysqlclient builds against the MariaDB headers; the clients bring mysqlslap and
# redis-benchmark, so `manage.py compare` can measure its ceilings from inside the stack.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential pkg-config libmariadb-dev mariadb-client redis-tools \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# The extras by role (pyproject.toml): the MySQL driver, the lab for the Locust processes and
# `make compare`, `run` for Flower. A web/worker-only image: --build-arg EXTRAS=mysql.
ARG EXTRAS=mysql,lab,run
# Dependencies first, so code changes do not reinstall them.
COPY pyproject.toml ./
COPY redpack/__init__.py redpack/__init__.py
COPY strategies/__init__.py strategies/__init__.py
RUN pip install ".[${EXTRAS}]"
COPY . .
RUN pip install --no-deps . \
    && SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput --verbosity 0

# /app/reports: where `make compare` writes (compose mounts a volume there, which starts with the
# published comparison that the admin shows).
RUN useradd --create-home --uid 1000 redpack && mkdir -p /data /app/reports \
    && chown redpack /data && chown -R redpack /app/reports
USER redpack

EXPOSE 8000 8089
CMD ["gunicorn", "redpack.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "2", "--threads", "32"]
