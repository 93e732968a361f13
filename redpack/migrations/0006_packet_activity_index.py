"""The packets' foreign key to their activity gets an index of its own, (activity_id), ahead of
(activity_id, status).

InnoDB checks a child row's foreign key whenever an entry of the key's index changes, and it
takes the first index that starts with the key's column: until now (activity_id, status), so
claiming a packet (its status changes) took a shared lock on the activity row. With the key on
(activity_id), which a claim never changes, a claim leaves the activity row alone, and a batch
can claim its packets before it takes the row (strategies/steps.py, "Lock order").

On MySQL the key is dropped and added again after the new index, so that it takes it; elsewhere
the index is only added.
"""

from django.db import migrations, models

TABLE = "t_redpack"
BY_ACTIVITY = models.Index(fields=["activity"], name="packet_activity")
BY_STATUS = models.Index(fields=["activity", "status"], name="packet_activity_status")


def _activity_key(schema_editor) -> str | None:
    """The name of t_redpack's foreign key to t_redpack_activity, if it has one."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TABLE)
    for name, constraint in constraints.items():
        target = constraint["foreign_key"]
        if target and target[0] == "t_redpack_activity":
            return name
    return None


def forwards(apps, schema_editor):
    Packet = apps.get_model("redpack", "Packet")
    if schema_editor.connection.vendor != "mysql":
        schema_editor.add_index(Packet, BY_ACTIVITY)
        return
    quote = schema_editor.quote_name
    key = _activity_key(schema_editor)
    # Plain statements: the schema editor's remove_index would add an index for the key first.
    statements = [f"DROP INDEX {quote(BY_STATUS.name)}"]
    if key is not None:
        statements.insert(0, f"DROP FOREIGN KEY {quote(key)}")
    statements += [
        f"ADD INDEX {quote(BY_ACTIVITY.name)} (activity_id)",
        f"ADD INDEX {quote(BY_STATUS.name)} (activity_id, status)",
    ]
    if key is not None:
        statements.append(
            f"ADD CONSTRAINT {quote(key)}"
            " FOREIGN KEY (activity_id) REFERENCES t_redpack_activity (id)"
        )
    for statement in statements:  # one by one: the indexes in this order, then the key
        schema_editor.execute(f"ALTER TABLE {quote(TABLE)} {statement}")


def backwards(apps, schema_editor):
    Packet = apps.get_model("redpack", "Packet")
    schema_editor.remove_index(Packet, BY_ACTIVITY)


class Migration(migrations.Migration):

    dependencies = [
        ("redpack", "0005_shards"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[migrations.AddIndex(model_name="packet", index=BY_ACTIVITY)],
        ),
    ]
