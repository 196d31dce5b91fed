"""The ``source:`` section of a pipeline file, and which kind of database a DSN names.

Here rather than in ``headrace.config`` so the sources' own modules read it without the rest of the
pipeline's settings; ``headrace.config`` re-exports it.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from headrace.core.errors import ConfigError
from headrace.core.names import ColumnName, TableName, TableNameError
from headrace.core.settings import Frozen as _Frozen
from headrace.core.settings import from_env as _from_env

MYSQL_SCHEMES = ("mysql", "mariadb")


def source_kind(dsn: str) -> str:
    """``postgresql`` or ``mysql`` for a DSN (by its scheme); ``ConfigError`` for another scheme."""
    text = dsn.strip()
    if "://" not in text:
        return "postgresql"  # libpq key=value (or empty: libpq's defaults)
    scheme = text.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    if scheme in MYSQL_SCHEMES:
        return "mysql"
    raise ConfigError(f"source.dsn has scheme {scheme}://, which headrace cannot read: use postgresql://"
                      " (or a libpq key=value string) for PostgreSQL, mysql:// or mariadb:// for MySQL/MariaDB")


class SourceConfig(_Frozen):
    """The database to replicate from: PostgreSQL, or MySQL/MariaDB (by the DSN's scheme)."""

    dsn: str | None = Field(None, description="libpq connection string or URL of the source database;"
                            " mysql:// or mariadb:// for MySQL/MariaDB (then tables are database.table)")
    dsn_env: str | None = Field(None, description="name of an environment variable holding the DSN")
    tables: list[str] = Field(
        default_factory=list, description="tables to replicate, in SQL syntax: schema.table or table (schema"
        ' public); quoted parts are exact (\'"Sales"."Order Items"\'), unquoted parts fold to lower case'
    )
    schemas: list[str] = Field(
        default_factory=list, description="instead of tables: replicate every table of these schemas, including"
        " tables created later (picked up while running); exact names, no quoting (Sales, not sales)"
    )
    all_tables: bool = Field(
        False, description="instead of tables: replicate every table of the database (outside the system"
        " schemas and _headrace), including tables created later"
    )
    discovery_seconds: float = Field(
        5.0, gt=0, description="how often the source catalog is checked for dropped, recreated and (with"
        " schemas / all_tables) new tables"
    )
    publication: str | None = Field(None, description="publication name; default headrace_<name>")
    slot: str | None = Field(None, description="replication slot name; default headrace_<name>")
    state_dsn: str | None = Field(
        None, description="Postgres holding the _headrace state schema; default: the source itself"
        " (required for a MySQL/MariaDB source)"
    )
    primary_dsn: str | None = Field(
        None, description="PostgreSQL 16+, when source.dsn is a hot standby: the primary's database, where"
        " headrace creates and updates the publication (a standby cannot) and writes its heartbeat; without it the"
        " publication must exist on the primary beforehand (headrace check prints the statement)"
    )
    failover_slot: bool = Field(
        True, description="PostgreSQL 17+: create the replication slot as a failover slot, which a standby with"
        " sync_replication_slots = on keeps in step, so headrace continues from it on the standby once promoted"
        " (no copy); the primary's synchronized_standby_slots should name that standby's physical slot"
    )
    stream_transactions: bool = Field(
        True, description="PostgreSQL 14+: read the change stream with pgoutput protocol 2 and streaming on, so"
        " a transaction larger than the server's logical_decoding_work_mem (64MB by default) arrives while it"
        " runs and is spilled to files under the staging folder instead of held anywhere until its commit;"
        " false (and before 14): protocol 1, each transaction sent whole at its commit"
        " (docs/postgres-versions.md#large-transactions)"
    )
    server_id: int | None = Field(
        None, ge=1, lt=2**32, description="MySQL/MariaDB only: the replica server_id the binlog client uses,"
        " unique among the server's replicas; default: one derived from the pipeline name"
    )
    max_retained_wal: int = Field(
        10 << 30, description="warn (status, /metrics, /readyz, log) when the slot makes the source keep more"
        " WAL than this: bytes or a size such as 10GB (the default); keep it well below the source's"
        " max_slot_wal_keep_size"
    )

    columns_as_text: list[str] = Field(
        default_factory=list, description="columns kept as PostgreSQL's exact text output in the target (a"
        " string column) instead of their mapped type, for values the mapped type cannot hold (multi-dimensional"
        " arrays, arrays with other lower bounds, NaN/Infinity in numeric(p,s)); SQL syntax schema.table.column"
        " (or table.column in public), quoted parts exact. Changing it for a copied table needs a resync"
    )

    @field_validator("max_retained_wal", mode="before")
    @classmethod
    def _size(cls, value: int | str) -> int:
        from headrace.core.size import parse_size

        return parse_size(value)

    @field_validator("tables")
    @classmethod
    def _qualified(cls, tables: list[str]) -> list[str]:
        # Kept in the display form (PostgreSQL's format('%I.%I')), which parses back to the same name.
        out = []
        for text in tables:
            try:
                out.append(str(TableName.parse(text)))
            except TableNameError as exc:
                raise ValueError(f"source.tables: {exc}") from None
        if len(set(out)) != len(out):
            twice = sorted({t for t in out if out.count(t) > 1})
            raise ValueError(f"source.tables lists {', '.join(twice)} twice")
        return out

    @field_validator("columns_as_text")
    @classmethod
    def _columns(cls, columns: list[str]) -> list[str]:
        out = []
        for text in columns:
            if text.strip().endswith("*"):
                raise ValueError(f"source.columns_as_text: {text!r}: list each column by name (no wildcards):"
                                 " a table's other columns keep their types")
            try:
                out.append(str(ColumnName.parse(text)))
            except TableNameError as exc:
                raise ValueError(f"source.columns_as_text: {exc}") from None
        if len(set(out)) != len(out):
            raise ValueError(f"source.columns_as_text lists {', '.join(sorted({c for c in out if out.count(c) > 1}))}"
                             " twice")
        return out

    @property
    def text_columns(self) -> frozenset[ColumnName]:
        """``columns_as_text`` as exact (table, column) names."""
        return frozenset(ColumnName.parse(c) for c in self.columns_as_text)

    @property
    def table_names(self) -> list[TableName]:
        """``tables`` as exact (schema, name) pairs."""
        return [TableName.parse(t) for t in self.tables]

    @model_validator(mode="after")
    def _one_way_of_naming_tables(self) -> SourceConfig:
        given = [name for name, value in (("tables", self.tables), ("schemas", self.schemas),
                                          ("all_tables", self.all_tables)) if value]
        if len(given) != 1:
            raise ValueError(
                "name the tables to replicate in exactly one way: tables: [schema.table, ...], schemas: [public,"
                f" ...] or all_tables: true (got {' and '.join(given) if given else 'none'})"
            )
        if len(set(self.schemas)) != len(self.schemas):
            raise ValueError("source.schemas lists a schema twice")
        if self.dsn:
            try:
                self._check_kind(self.dsn)
            except ConfigError as exc:  # pydantic reports ValueErrors with the field's path
                raise ValueError(str(exc)) from None
        return self

    def _check_kind(self, dsn: str) -> str:
        """The source kind of ``dsn``; a MySQL source without a PostgreSQL for the state is refused."""
        kind = source_kind(dsn)
        if kind == "mysql" and not self.state_dsn:
            raise ConfigError(
                "source.state_dsn is required with a MySQL/MariaDB source: headrace keeps its state (the"
                " _headrace tables) in PostgreSQL. Add source.state_dsn: postgresql://user@host/db"
                " (any PostgreSQL database headrace may create a schema in)")
        if kind == "mysql" and self.columns_as_text:
            raise ConfigError("source.columns_as_text is for PostgreSQL sources: remove it for a MySQL/MariaDB"
                              " source (every MySQL type has a mapping)")
        return kind

    @property
    def discovers(self) -> bool:
        """Tables are found in the catalog (schemas / all_tables), so new ones are picked up while running."""
        return bool(self.schemas) or self.all_tables

    def resolved_dsn(self) -> str:
        dsn = _from_env(self.dsn, self.dsn_env, "source.dsn")
        if not dsn:
            raise ConfigError("source.dsn (or source.dsn_env) is required")
        return dsn

    def resolved_state_dsn(self) -> str:
        """Where the state lives: ``state_dsn``, else the source (PostgreSQL only; ``ConfigError`` for MySQL)."""
        dsn = self.resolved_dsn()
        self._check_kind(dsn)
        return self.state_dsn or dsn


