"""The packets' foreign key to their activity gets an index of its own, (activity_id), ahead of
(activity_id, status).

InnoDB checks a child row's foreign key whenever an entry of the key's index changes, and it
takes the first index that starts with the key's column: until now (activity_id, status), so
claiming a packet (its status changes) took a shared lock on the activity row. With the key on
(activity_id), which a claim never changes, a claim leaves the activity row alone, and a batch
can claim its packets before it takes the row (strategies/steps.py, "Lock order").

On MySQL the key is dropped and added again after the new index, so that it takes it; elsewhere
the index is only added. On a large t_redpack, run it at a quiet moment: rebuilding the
(activity_id, status) index takes a while, and the table is without its key meanwhile.

Reversing it leaves the key on (activity_id, status) again, where a claim locks the activity row
shared: the code from this migration on (steps.record_grabs claims before it takes the row)
then deadlocks concurrent batches, so reverse it only together with that code.
"""

from django.db import migrations, models

TABLE = "t_redpack"
BY_ACTIVITY = models.Index(fields=["activity"], name="packet_activity")
BY_STATUS = models.Index(fields=["activity", "status"], name="packet_activity_status")


def _activity_key(constraints) -> str | None:
    """The name of t_redpack's foreign key to t_redpack_activity, if it has one."""
    for name, constraint in constraints.items():
        target = constraint["foreign_key"]
        if target and target[0] == "t_redpack_activity":
            return name
    return None


def forwards(apps, schema_editor):
    Packet = apps.get_model("redpack", "Packet")
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        schema_editor.add_index(Packet, BY_ACTIVITY)
        return
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TABLE)
    found = _activity_key(constraints)
    # The key's name as Django gives it, when a run cut short left the table without it.
    key = found or schema_editor._create_index_name(
        TABLE, ["activity_id"], suffix="_fk_t_redpack_activity_id"
    )
    quote = schema_editor.quote_name
    # Plain statements, each only if still needed, so that a run cut short can run again (the
    # schema editor's remove_index would add an index for the key first).
    statements = []
    if found is not None:
        statements.append(f"DROP FOREIGN KEY {quote(key)}")
    if BY_STATUS.name in constraints:
        statements.append(f"DROP INDEX {quote(BY_STATUS.name)}")
    if BY_ACTIVITY.name not in constraints:
        statements.append(f"ADD INDEX {quote(BY_ACTIVITY.name)} (activity_id)")
    statements.append(f"ADD INDEX {quote(BY_STATUS.name)} (activity_id, status)")
    for statement in statements:  # one by one: the indexes in this order, then the key
        schema_editor.execute(f"ALTER TABLE {quote(TABLE)} {statement}")
    # The rows were checked against the key until a moment ago: adding it back unchecked lets
    # MariaDB add it in place, instead of copying the whole table.
    schema_editor.execute("SET SESSION foreign_key_checks = 0")
    try:
        schema_editor.execute(
            f"ALTER TABLE {quote(TABLE)} ADD CONSTRAINT {quote(key)}"
            " FOREIGN KEY (activity_id) REFERENCES t_redpack_activity (id)"
        )
    finally:
        schema_editor.execute("SET SESSION foreign_key_checks = 1")


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
