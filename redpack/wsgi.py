import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "redpack.settings")
# The web process waits at most this long for a MySQL reply (settings.py, DB_READ_TIMEOUT):
# longer than InnoDB's lock wait (50 s), which a grab may rightly spend on a row.
os.environ.setdefault("DB_READ_TIMEOUT", "90")

application = get_wsgi_application()
