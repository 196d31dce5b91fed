"""The schema model: a replicated table's columns, their logical types, and its key.

Logical types sit between PostgreSQL's types and each target's: the source maps a PostgreSQL type
to a ``ColumnType`` once, and every target maps a ``ColumnType`` to its own type. Values travel as
PostgreSQL's text output (from COPY and from pgoutput alike), so one cast per logical type serves
the initial copy and the change stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from headrace.core.errors import SchemaChangeError
from headrace.core.names import TableName

# The row shape's column names, also importable from here (they were defined here first).
from headrace.core.rows import HR_COMMIT_TS, HR_LSN, HR_OP, HR_SEQ, HR_UNCHANGED  # noqa: F401


class TypeKind(str, Enum):
    """The logical types headrace distinguishes."""

    INT = "int"  # smallint, integer
    LONG = "long"  # bigint
    FLOAT = "float"  # real
    DOUBLE = "double"  # double precision
    DECIMAL = "decimal"  # numeric(p,s)
    BOOLEAN = "boolean"
    STRING = "string"  # text, varchar, char, enum, inet, unconstrained numeric, anything else
    DATE = "date"
    TIME = "time"  # time without time zone
    TIMESTAMP = "timestamp"  # timestamp without time zone
    TIMESTAMPTZ = "timestamptz"
    BINARY = "binary"  # bytea
    UUID = "uuid"
    JSON = "json"  # json, jsonb
    INTERVAL = "interval"
    LIST = "list"  # one-dimensional array of another logical type


@dataclass(frozen=True, slots=True)
class ColumnType:
    """A logical type; ``pg_type`` keeps PostgreSQL's own spelling for messages and docs."""

    kind: TypeKind
    pg_type: str
    precision: int | None = None
    scale: int | None = None
    element: ColumnType | None = None


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a source table as replication sees it."""

    name: str
    type: ColumnType
    type_oid: int
    typmod: int = -1
    nullable: bool = True
    # pg_attribute.attnum: a column's identity across renames (None when not known, e.g. old state).
    attnum: int | None = None
    # The value rows that existed before an ``ADD COLUMN ... DEFAULT`` hold (PostgreSQL's
    # attmissingval, as text); None when they hold NULL.
    missing: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A source table: identity (``oid``), name, columns in order, and the key used to match rows.

    ``key`` lists the primary-key (or replica-identity index) columns. An empty key means the table
    is replicated with REPLICA IDENTITY FULL and every column identifies a row.
    """

    oid: int
    schema: str
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    replica_identity: str = "d"  # pg_class.relreplident: d(efault), n(othing), f(ull), i(ndex)
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    # (schema, table) the target keeps using after the source table was renamed; None = follow the
    # source name. Not part of the shape: the same table under either name compares equal.
    target_as: tuple[str, str] | None = field(default=None, compare=False, hash=False)

    @property
    def table_name(self) -> TableName:
        """The source table's exact (schema, name)."""
        return TableName(self.schema, self.name)

    @property
    def qualified_name(self) -> str:
        """``schema.table`` as PostgreSQL quotes it (``public.orders``, ``public."Order Items"``)."""
        return str(self.table_name)

    def column(self, name: str) -> Column:
        """The column called ``name``; KeyError if there is none."""
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(f"{self.qualified_name} has no column {name!r}")

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def target_schema(self) -> str:
        """The schema part of the target table's name (before any configured override)."""
        return self.target_as[0] if self.target_as else self.schema

    @property
    def target_table(self) -> str:
        """The target table's name: the source name, or the one kept across a rename."""
        return self.target_as[1] if self.target_as else self.name


@dataclass(frozen=True)
class SchemaChange:
    """One schema change between two shapes of a table, as a target applies it.

    ``kind`` is one of ``headrace.control.metrics.DDL_KINDS``. ``column`` is the column in the new
    shape (in the old shape for ``drop_column``); ``old_name`` is set for renames, ``old_type`` for
    type changes. ``apply`` is False when the target has nothing to do (a dropped column kept by
    policy, a type change both shapes store alike, a table rename the target name does not follow).
    """

    kind: str
    detail: str
    column: Column | None = None
    old_name: str | None = None
    old_type: ColumnType | None = None
    apply: bool = True


def rename_collision(table: TableSchema, change: SchemaChange, target_name: str) -> SchemaChangeError:
    """The error for a column renamed to the name of a column the target kept after a drop."""
    assert change.column is not None
    return SchemaChangeError(
        f"{table.qualified_name}: column {change.old_name} was renamed to {change.column.name}, which the"
        f" target table {target_name} still has (a dropped column kept by policy); drop it there or run"
        f" `headrace resync {table.qualified_name}`"
    )


def _type_to_dict(t: ColumnType) -> dict[str, object]:
    out: dict[str, object] = {"kind": t.kind.value, "pg_type": t.pg_type}
    if t.precision is not None:
        out["precision"] = t.precision
    if t.scale is not None:
        out["scale"] = t.scale
    if t.element is not None:
        out["element"] = _type_to_dict(t.element)
    return out


def _type_from_dict(d: dict[str, object]) -> ColumnType:
    element = d.get("element")
    return ColumnType(
        kind=TypeKind(d["kind"]),
        pg_type=str(d["pg_type"]),
        precision=d.get("precision"),  # type: ignore[arg-type]
        scale=d.get("scale"),  # type: ignore[arg-type]
        element=_type_from_dict(element) if isinstance(element, dict) else None,
    )


def schema_to_dict(table: TableSchema) -> dict[str, object]:
    """A JSON-able form of ``table`` (stored in the state tables and the staged log)."""
    out: dict[str, object] = {
        "oid": table.oid,
        "schema": table.schema,
        "name": table.name,
        "key": list(table.key),
        "replica_identity": table.replica_identity,
        "columns": [
            {"name": c.name, "type": _type_to_dict(c.type), "type_oid": c.type_oid, "typmod": c.typmod,
             "nullable": c.nullable, "attnum": c.attnum, "missing": c.missing}
            for c in table.columns
        ],
    }
    if table.target_as is not None:
        out["target_as"] = list(table.target_as)
    if table.extra:
        out["extra"] = dict(table.extra)
    return out


def schema_from_dict(d: dict[str, object]) -> TableSchema:
    """Inverse of ``schema_to_dict``."""
    columns = tuple(
        Column(name=c["name"], type=_type_from_dict(c["type"]), type_oid=c["type_oid"], typmod=c["typmod"],
               nullable=c["nullable"], attnum=c.get("attnum"), missing=c.get("missing"))
        for c in d["columns"]  # type: ignore[attr-defined]
    )
    target_as = d.get("target_as")
    return TableSchema(
        oid=int(d["oid"]),  # type: ignore[call-overload]
        schema=str(d["schema"]),
        name=str(d["name"]),
        columns=columns,
        key=tuple(d["key"]),  # type: ignore[arg-type]
        replica_identity=str(d.get("replica_identity", "d")),
        target_as=(str(target_as[0]), str(target_as[1])) if isinstance(target_as, list) else None,
        extra=dict(d.get("extra") or {}),  # type: ignore[call-overload]
    )
