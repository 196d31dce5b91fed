"""Identities the binlog stream keeps for tracked tables: column ids across renames, a table's id
across ``RENAME TABLE``, and the tables dropped or created under a tracked name.

MySQL has neither a table OID nor a column attnum. A table's id is ``catalog.table_id`` of the name
it had when it was first tracked; after a rename the stream maps the new name to that id
(``renamed``). A column's id (``Column.attnum``) is its ORDINAL_POSITION when the table is first
seen (what ``catalog.read_table_schema`` gives), then follows the column: a rename (``RENAME
COLUMN``, ``CHANGE``) keeps it, a dropped column's id is retired, an added column gets the next
unused one. Both persist through the schemas state keeps: the stream is given them (``known``) and
continues from their names and attnums, and adopts a schema again when state hands it a new one
(a table tracked or copied again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from headrace.core.schema import TableSchema
from headrace.source.mysql.catalog import table_id
from headrace.source.mysql.ddl import Ddl, Name

TableFilter = Callable[[str, str], bool]
Known = Callable[[], Mapping[int, TableSchema]]


class Identities:
    """Table and column identities of the tracked tables, kept by ``BinlogStream``.

    Public, for the adapter: ``renamed`` (current name -> id of a table renamed since it was
    tracked), ``dropped`` (id -> binlog position of the DDL that dropped it), ``created`` (name ->
    position of a CREATE, or a rename onto it, of a table under a name a tracked table had).
    """

    def __init__(self, tracked: TableFilter, known: Known | Mapping[int, TableSchema] | None) -> None:
        self._tracked = tracked
        if known is None:
            self._known: Known = dict
        elif callable(known):
            self._known = known
        else:
            fixed = dict(known)
            self._known = lambda: fixed
        self._ids: dict[int, dict[str, int]] = {}  # oid -> lower-cased column name -> id
        self._next: dict[int, int] = {}  # oid -> next unused column id
        self._adopted: dict[int, TableSchema] = {}  # oid -> the known schema its ids came from
        self._vacated: set[Name] = set()  # names a tracked table left (renamed away or dropped)
        # Tables adopted whose first TABLE_MAP is still to come: a column it has that the adopted schema
        # has not may be new or renamed by DDL the stream did not see (before its start position).
        self._unsure: set[int] = set()
        self._labeled: dict[int, tuple[TableSchema, tuple[tuple[str, int], ...], TableSchema]] = {}  # label's last
        self.renamed: dict[Name, int] = {}
        self.dropped: dict[int, int] = {}
        self.dropped_names: dict[int, Name] = {}  # id -> the name it had when dropped
        self.created: dict[Name, int] = {}
        # id -> (position, schema) of a copy of that table: DDL of the table before that position is older
        # than the copy, which already shows its outcome (``copied``).
        self._copies: dict[int, tuple[int, TableSchema]] = {}
        for oid, schema in self._known().items():
            self._adopt(oid, schema)

    def _adopt(self, oid: int, schema: TableSchema) -> None:
        """Take ``schema``'s column ids (positions where it has none) and its name."""
        top = max((c.attnum for c in schema.columns if c.attnum is not None), default=0)
        ids: dict[str, int] = {}
        for c in schema.columns:  # a column without an id (old state, or one unsure) gets an unused one
            if c.attnum is None:
                top += 1
            ids[c.name.lower()] = c.attnum if c.attnum is not None else top
        self._ids[oid], self._next[oid] = ids, top + 1
        self._adopted[oid] = schema
        self._unsure.add(oid)
        name = (schema.schema, schema.name)
        self._vacated.discard(name)
        self.created.pop(name, None)
        if table_id(*name) != oid:
            self.renamed[name] = oid
        self.dropped.pop(oid, None)  # tracked again (resync): its rows flow again

    def oid_of(self, database: str, table: str) -> int | None:
        """The id of tracked table ``database.table`` as named now, or None (untracked or dropped)."""
        name = (database, table)
        oid = self.renamed.get(name)
        if oid is None:
            if not self._tracked(database, table):
                return None
            oid = table_id(database, table)
        schema = self._known().get(oid)
        if schema is not None and schema is not self._adopted.get(oid):
            self._adopt(oid, schema)  # tracked (again): state's schema is the reference
        if name in self._vacated or oid in self.dropped or self.renamed.get(name, oid) != oid:
            return None  # the name a tracked table left; a dropped table until it is tracked again
        return oid

    def copied(self, oid: int, schema: TableSchema, position: int) -> None:
        """Table ``oid`` is being copied as ``schema`` (read from the catalog after binlog ``position``):
        a table the binlog dropped is tracked again (its rows flow from now, before the copy's chunks
        take their snapshots, so no row falls between), and a DROP or CREATE of it the stream reads
        later but that sits before ``position`` is already behind the copy: the stream then takes
        ``schema`` instead of stopping the table."""
        self._copies[oid] = (position, schema)
        if oid in self.dropped:
            self._readopt(oid, schema)

    def _readopt(self, oid: int, schema: TableSchema) -> None:
        self._adopt(oid, schema)
        known = self._known().get(oid)
        if known is not None:
            self._adopted[oid] = known  # else oid_of would take state's (the dropped table's) schema back
        self.dropped_names.pop(oid, None)

    def adopted(self, oid: int) -> TableSchema | None:
        """The schema state gave for tracked table ``oid`` (its ids' origin), None if it gave none."""
        return self._adopted.get(oid)

    def name_of(self, oid: int) -> Name | None:
        """The current name of tracked table ``oid`` (after renames), None if dropped or never seen."""
        if oid in self.dropped:
            return None
        for name, renamed in self.renamed.items():
            if renamed == oid:
                return name
        schema = self._adopted.get(oid)
        return (schema.schema, schema.name) if schema is not None else None

    def label(self, oid: int, shape: TableSchema) -> TableSchema:
        """``shape`` (from a TABLE_MAP) under id ``oid``, each column with its id."""
        ids = self._ids.get(oid)
        last = self._labeled.get(oid)
        # The same shape object (a TABLE_MAP body seen before) under the same ids: the same labels, and
        # the same object (the stream's per-shape plans stay valid).
        if (last is not None and last[0] is shape and ids is not None and last[1] == tuple(ids.items())
                and oid not in self._unsure):
            return last[2]
        if ids is None:  # first sight, not known to state: ORDINAL_POSITION, as the catalog gives
            ids = self._ids[oid] = {c.name.lower(): i + 1 for i, c in enumerate(shape.columns)}
            self._next[oid] = len(ids) + 1
        present = {c.name.lower() for c in shape.columns}
        for gone in [n for n in ids if n not in present]:
            del ids[gone]  # dropped by a statement not read here: its id is retired all the same
        unsure = oid in self._unsure
        self._unsure.discard(oid)
        unknown = set()
        for c in shape.columns:
            if c.name.lower() not in ids:
                ids[c.name.lower()] = self._next[oid]
                self._next[oid] += 1
                unknown.add(c.name.lower())
        # Such a column is sent without an id, once: the evolution path then pairs it by position
        # (a rename of any column but the last is recognised) instead of taking it as certainly new.
        columns = tuple(replace(c, attnum=None if unsure and c.name.lower() in unknown else ids[c.name.lower()])
                        for c in shape.columns)
        labeled = replace(shape, oid=oid, columns=columns)
        self._labeled[oid] = (shape, tuple(ids.items()), labeled)
        return labeled

    def apply(self, ddl: Ddl, position: int) -> list[tuple[int, Name]]:
        """Apply one statement's effects; returns the tracked tables it renamed, as (id, new name)."""
        for name, pairs in ddl.renamed_columns.items():
            ids = self._ids.get(self.oid_of(*name) or -1)
            if ids is not None:
                # All renames of one ALTER refer to the names before it (CHANGE a b, CHANGE b a swaps).
                moved = {a.lower(): ids.pop(a.lower()) for a, _b in pairs if a.lower() in ids}
                for a, b in pairs:
                    if a.lower() in moved:
                        ids[b.lower()] = moved[a.lower()]
        for name, columns in ddl.dropped_columns.items():
            known = self._ids.get(self.oid_of(*name) or -1, {})
            for column in columns:
                known.pop(column.lower(), None)
        renamed: list[tuple[int, Name]] = []
        for old, new in ddl.renamed_tables:
            oid = self.oid_of(*old)
            if oid is None and new in self._vacated:
                self.created[new] = position  # another table now has a tracked table's name
            if oid is None:
                continue
            self.renamed.pop(old, None)
            self._vacated.add(old)
            self._vacated.discard(new)
            self.renamed[new] = oid
            renamed.append((oid, new))
        for name in ddl.dropped_tables + ddl.replaced_tables:
            oid = self.oid_of(*name)
            if oid is not None and position < self._copies.get(oid, (-1,))[0]:
                self._readopt(oid, self._copies[oid][1])  # older than its copy: the copy has the new table
            elif oid is not None:
                self.dropped[oid] = position
                self.dropped_names[oid] = name
                self.renamed.pop(name, None)
                self._vacated.add(name)
        for name in ddl.created_tables + ddl.replaced_tables:
            if name in self._vacated:
                self.created[name] = position
        return renamed


def dropped_message(table: str, dropped_at: str, created_at: str | None) -> str:
    """What a user reads when the binlog shows tracked table ``table`` dropped (at position ``dropped_at``)
    and maybe created again (``created_at``): its changes stopped there; the fix copies the new one."""
    if created_at is None:
        return (f"table {table} was dropped on the source (binlog {dropped_at}); its changes stop there."
                f" Remove it (headrace remove-table {table}), or, if it comes back, copy it again"
                f" (headrace resync {table})")
    return (f"table {table} was dropped (binlog {dropped_at}) and created again (binlog {created_at}) on the"
            f" source: the new table is another one, whose rows cannot follow the old one's."
            f" Copy it again: headrace resync {table}")
