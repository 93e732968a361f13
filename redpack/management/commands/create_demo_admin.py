from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create (or reset) the demo admin user that `make run` prints."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default="admin")

    def handle(self, *args: object, **options: object) -> None:
        User = get_user_model()
        user, created = User.objects.get_or_create(username=options["username"])
        user.is_staff = user.is_superuser = True
        user.set_password(str(options["password"]))
        user.save()
        self.stdout.write(f"demo admin {'created' if created else 'updated'}: {user.username}")
