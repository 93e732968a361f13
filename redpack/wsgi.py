"""The WSGI application, reading chunked request bodies for Django.

Django reads Content-Length bytes of a body and nothing else, so a body sent with
`Transfer-Encoding: chunked` (no length: .NET's JsonContent, Spring's RestClient, Node's
http.request, requests given a generator) would reach the views as empty. A server that
decodes the chunks itself says so with `wsgi.input_terminated` (gunicorn does): the body is
then read here, at most one byte over DATA_UPLOAD_MAX_MEMORY_SIZE, and handed on with its
Content-Length, so that the views read it and api/middleware.py measures it (413 over the limit)
as any other. A body whose chunks cannot be read is a 400 naming `Transfer-Encoding`.
"""

import io
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")


def reading_chunked_bodies(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    from django.conf import settings

    def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if (
            not environ.get("CONTENT_LENGTH")
            and "HTTP_TRANSFER_ENCODING" in environ
            and environ.get("wsgi.input_terminated")
        ):
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            try:
                body = environ["wsgi.input"].read(-1 if limit is None else limit + 1)
            except (OSError, ValueError) as exc:  # a malformed chunk (gunicorn: an IOError)
                return _unreadable(start_response, exc)
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
        return app(environ, start_response)

    return application


def _unreadable(start_response: Callable[..., Any], exc: Exception) -> Iterable[bytes]:
    """400 in the API's error shape (api/errors.py), naming the transfer coding at fault."""
    from redpack.api.errors import error_body

    message = f"the chunked body could not be read: {exc}"[:200]
    body = json.dumps(error_body("bad_request", message, {"Transfer-Encoding": [message]}))
    answer = body.encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))]
    start_response("400 Bad Request", headers)
    return [answer]


application = reading_chunked_bodies(get_wsgi_application())
