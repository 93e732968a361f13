"""A WSGI app for tests/test_webworker.py: each request says it arrived (its worker's pid, on a
Redis list) and is answered only once the test releases it, so that a test can hold requests
open on a real gunicorn and see which worker took each."""

import os

import redis

_redis = redis.Redis.from_url(os.environ["HELD_APP_REDIS_URL"])
_key = os.environ["HELD_APP_KEY"]
_redis.rpush(f"{_key}:booted", os.getpid())  # a worker loads the app once it is counted


def application(environ, start_response):  # type: ignore[no-untyped-def]
    _redis.rpush(f"{_key}:arrived", os.getpid())
    released = _redis.blpop([f"{_key}:release"], timeout=60)
    body = f"{os.getpid()} {'released' if released else 'timed out'}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
