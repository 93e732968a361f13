import MySQLdb
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS


class Command(BaseCommand):
    help = "Create the configured MySQL/MariaDB database (utf8mb4) if it does not exist."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            choices=list(settings.DATABASES),
            help="Which database (a shard's alias of REDPACK_SHARDS); default: default.",
        )

    def handle(self, *args: object, **options: object) -> None:
        db = settings.DATABASES[str(options["database"])]
        if db["ENGINE"] != "django.db.backends.mysql":
            self.stdout.write(f"{db['ENGINE']}: nothing to create")
            return
        try:
            conn = MySQLdb.connect(
                host=db.get("HOST") or "127.0.0.1",
                port=int(db.get("PORT") or 3306),
                user=db.get("USER") or "root",
                password=db.get("PASSWORD") or "",
            )
        except MySQLdb.Error as exc:
            where = f"{db.get('HOST')}:{db.get('PORT')}"
            raise CommandError(f"cannot reach MySQL at {where}: {exc}") from exc
        name = db["NAME"].replace("`", "``")
        with conn.cursor() as cursor:
            cursor.execute(
                f"CREATE DATABASE IF NOT EXISTS `{name}` "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
        conn.close()
        self.stdout.write(f"database {db['NAME']} is ready")
