"""A WSGI app for tests/test_webworker.py, run by a real gunicorn with redpack's worker class.

- `/hello`: answers its worker's pid at once;
- `/collector`: its worker's garbage collector, `<objects frozen> <youngest threshold>`;
- `/open-files`: its worker's soft limit of open files;
- `/held`: answers the requests all the server's workers hold (redpack/webworker.py's shared
  counts; the asking request is one of them);
- `/busy`: each worker's busy connections of its last full period (redpack/webworker.py's
  `_tally`), for the workers that can accept, in increasing order;
- anything else says it arrived (its worker's pid, on a Redis list) and is answered only once
  the test releases it, so that a test can hold requests open and see which worker took each.
"""

import gc
import os
import resource

import redis

from redpack import webworker

_redis = redis.Redis.from_url(os.environ["HELD_APP_REDIS_URL"])
_key = os.environ["HELD_APP_KEY"]
_redis.rpush(f"{_key}:booted", os.getpid())  # a worker loads the app once it has its slot


def application(environ, start_response):  # type: ignore[no-untyped-def]
    path = environ["PATH_INFO"]
    if path == "/hello":
        body = str(os.getpid()).encode()
    elif path == "/collector":
        body = f"{gc.get_freeze_count()} {gc.get_threshold()[0]}".encode()
    elif path == "/open-files":
        body = str(resource.getrlimit(resource.RLIMIT_NOFILE)[0]).encode()
    elif path == "/held":
        body = str(sum(webworker._held[s] for s in range(webworker._used.value))).encode()
    elif path == "/busy":
        ready = [s for s in range(webworker._used.value) if webworker._ready[s]]
        body = " ".join(str(n) for n in sorted(webworker._busy[s] for s in ready)).encode()
    else:
        _redis.rpush(f"{_key}:arrived", os.getpid())
        released = _redis.blpop([f"{_key}:release"], timeout=60)
        body = f"{os.getpid()} {'released' if released else 'timed out'}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
