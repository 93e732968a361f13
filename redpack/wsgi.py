import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")
# The process serves the web app: its own defaults (settings.py: DB_READ_TIMEOUT).
os.environ.setdefault("REDPACK_WEB_PROCESS", "1")

application = get_wsgi_application()
