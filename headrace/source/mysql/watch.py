"""The catalog watch of a MySQL/MariaDB source: tables created while running, and tables dropped and
created again (``run.table_watch`` polls it every ``source.discovery_seconds``).

The binlog already carries drops and renames, which the stream follows (``identity.py``): a tracked
table is never "gone" to this watch (``alive`` is every tracked table), so a DROP stops the table
through the stream (ERRORED, with the fix) rather than through the catalog, which cannot tell a
drop from a rename not read yet. What the stream cannot do alone is copy a table:

- with ``schemas:`` / ``all_tables``, a table of a watched database that state does not track is new
  (``listed``); the run tracks it as the API's add-table does (capture first, then a copy whose
  chunks take their snapshots afterwards, so its rows are staged or copied, never neither);
- a tracked table the stream saw dropped and created again under its name (``extra["recreated"]``)
  is copied again when ``schema_changes.recreated_table`` is ``resync`` (``MySqlSource.schema_at``
  tracks it again in the stream before the copy's chunks read it).

A renamed tracked table is listed under its tracked id (``MySqlSource.list_tables``), not as new.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.core.names import TableName
from headrace.source.base import CatalogPoll, CatalogWatch

if TYPE_CHECKING:
    from headrace.source.mysql.source import MySqlSource


class MySqlCatalogWatch(CatalogWatch):
    """New and recreated tables of a MySQL/MariaDB source (see the module docstring)."""

    def __init__(self, source: MySqlSource) -> None:
        self.source = source

    def poll(self, tracked: dict[int, TableName], schemas: list[str] | None, discovers: bool) -> CatalogPoll:
        with self.source.connect() as conn:
            # The stream's drops are read first: a table recreated after this poll waits for the next.
            recreated = self.source.recreated()
            listed = self.source.list_tables(conn, schemas) if discovers else {}
            position = self.source.current_position(conn)
        return CatalogPoll(alive=set(tracked), listed=listed, successors={}, leaves={}, position=position,
                           extra={"recreated": {oid: name for oid, name in recreated.items() if oid in tracked}})

    def existing(self, conn: Any, oids: list[int]) -> set[int]:
        return {oid for oid in oids if self.source.current_names(conn, [oid])}
