"""The copy's chunk read without per-row Python: connectorx (a compiled reader) straight into Arrow.

The server prints most values as the text the copy stages (``types.to_text``): each column is read
through a SELECT expression (``CAST(col AS CHAR)``, the hex of a binary value, the digits of a BIT)
and Arrow's compute kernels turn the server's spelling of dates and times into Python's (zero dates
to ``-infinity``, fractions of a second to six digits or none). FLOAT and DOUBLE are read in binary
(the server's text drops bits) and printed per value, as the pymysql path does. A type outside
``_READS`` (MySQL's JSON) keeps the whole table on the pymysql path (``arrow_plan`` says why).

The snapshot is the pymysql path's: connectorx runs ``START TRANSACTION WITH CONSISTENT SNAPSHOT``
on the connection it then reads with (``pre_execution_query``), and the query returns the
snapshot's binlog position (``information_schema.SESSION_STATUS``) beside the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from headrace.core.errors import SourceError, TransientError
from headrace.core.names import TableName
from headrace.core.schema import Column, TableSchema
from headrace.source.mysql.connect import parse_dsn
from headrace.source.mysql.copy_locks import marked
from headrace.source.mysql.position import to_int
from headrace.source.mysql.types import ZERO_DATE_TEXT, _float32_text, base_type, type_args

Post = Callable[[pa.ChunkedArray], pa.ChunkedArray | pa.Array]
_INTEGERS = ("tinyint", "smallint", "mediumint", "int", "bigint")
_TEXTS = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "uuid", "inet4", "inet6")
_BINARIES = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")
# '\x' whatever the session's sql_mode says of backslashes in literals.
_HEX_PREFIX = "CHAR(92, 120 USING ascii)"
# Year, month or day 0000/00: no date in Python (pymysql hands the text on; to_text: -infinity).
_ZERO_DATE = r"^(0000-|\d{4}-00-|\d{4}-\d\d-00)"
_POSITION = ("(SELECT GROUP_CONCAT(VARIABLE_VALUE ORDER BY VARIABLE_NAME SEPARATOR ':')"
             " FROM information_schema.SESSION_STATUS"
             " WHERE VARIABLE_NAME IN ('BINLOG_SNAPSHOT_FILE', 'BINLOG_SNAPSHOT_POSITION'))")
_TABLE_DEF_CHANGED = "1412"
_LOST = ("2013", "2006", "Lost connection", "server has gone away", "Connection refused", "broken pipe")


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _zero_dates(texts: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(pc.match_substring_regex(texts, _ZERO_DATE), pa.scalar(ZERO_DATE_TEXT), texts)


def _datetime(fsp: int, suffix: str) -> Post:
    """Python's ``isoformat(sep=' ')`` from the server's text with ``fsp`` fractional digits."""
    def post(texts: pa.ChunkedArray) -> pa.ChunkedArray:
        out = texts
        if fsp:
            out = pc.replace_substring_regex(out, r"\.0+$", "")
            if fsp < 6:
                out = pc.replace_substring_regex(out, rf"(\.\d{{{fsp}}})$", r"\1" + "0" * (6 - fsp))
        if suffix:
            out = pc.binary_join_element_wise(out, pa.scalar(suffix), "")
        zero = pc.match_substring_regex(texts, _ZERO_DATE)
        return pc.if_else(zero, pa.scalar(ZERO_DATE_TEXT), out)
    return post


def _per_value(text: Callable[[float], str]) -> Post:
    return lambda values: pa.array([None if v is None else text(v) for v in values.to_pylist()], pa.string())


def _read(column: Column) -> tuple[str, Post | None] | None:
    """(SELECT expression, Arrow function to the staged text or None) for ``column``; None: not read here."""
    base, name = base_type(column.type), _quote(column.name)
    as_text = f"CAST({name} AS CHAR)"
    if base in _INTEGERS or base == "decimal" or base in _TEXTS or base == "time":
        return as_text, None  # the server's text is to_text's: digits, exactly s decimals, [-]H:MM:SS[.f]
    if base == "year":
        return f"CAST({name} + 0 AS CHAR)", None  # YEAR 0000 -> '0'
    if base == "date":
        return as_text, _zero_dates
    if base in ("datetime", "timestamp"):
        return as_text, _datetime((type_args(column.type) or (0,))[0], "+00" if base == "timestamp" else "")
    if base == "bit":
        n = type_args(column.type)[0]
        if n == 1:
            return f"IF({name} IS NULL, NULL, IF({name} + 0 = 0, 'f', 't'))", None
        return f"LPAD(BIN({name} + 0), {n}, '0')", None
    if base in _BINARIES:
        return f"CONCAT({_HEX_PREFIX}, LOWER(HEX({name})))", None
    if base == "geometry" or base in ("point", "linestring", "polygon"):
        return f"CONCAT({_HEX_PREFIX}, LOWER(HEX(SUBSTRING({name}, 5))))", None  # WKB after the 4-byte SRID
    if base == "double":
        return f"CAST({name} AS DOUBLE)", _per_value(repr)
    if base == "float":
        return name, _per_value(_float32_text)
    return None


def arrow_plan(columns: Sequence[Column]) -> list[tuple[str, Post | None]] | str:
    """How the compiled reader reads each column, or why it cannot read the table exactly."""
    try:
        import connectorx  # noqa: F401
    except ImportError:
        return "connectorx is not installed (pip install connectorx)"
    plan = []
    for column in columns:
        read = _read(column)
        if read is None:
            return f"column {column.name} ({column.type.pg_type}) has no exact compiled read"
        plan.append(read)
    return plan


def _url(dsn: str) -> str:
    parsed = parse_dsn(dsn)
    # prefer_socket=false: the mysql crate would switch to the server's socket as 'user'@'localhost'.
    return (f"mysql://{quote(parsed.user, safe='')}:{quote(parsed.password, safe='')}@{parsed.host}:{parsed.port}"
            f"/{quote(parsed.database, safe='')}?prefer_socket=false")


def read_chunk_arrow(dsn: str, schema: TableSchema, plan: list[tuple[str, Post | None]], where: str,
                     before: Sequence[str], batch_rows: int, epoch: int = 0) -> Iterator[pa.RecordBatch]:
    """``copy.copy_chunk``'s batches (``c0..cN`` strings and ``_pos``) read by connectorx under its own
    consistent snapshot. ``where``: the chunk's condition with its bounds inlined; ``before``:
    statements run in the snapshot before the read (tests' holds)."""
    import connectorx

    table = TableName(schema.schema, schema.name)
    sql = (f"SELECT {marked(schema.oid)} {', '.join(e for e, _ in plan)}, {_POSITION} AS _pos"
           f" FROM {_quote(schema.schema)}.{_quote(schema.name)}{where}")
    setup = ["SET time_zone = '+00:00'", "SET NAMES utf8mb4",
             "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ", "START TRANSACTION WITH CONSISTENT SNAPSHOT",
             *before]
    names = [f"c{i}" for i in range(len(plan))]
    out_schema = pa.schema([*(pa.field(n, pa.string()) for n in names), pa.field("_pos", pa.int64())])
    try:
        # return_type="arrow" reads with the GIL released (its "arrow_stream" holds it for the whole
        # read, stalling capture and the copy's lock watch): the chunk comes whole, bounded by its range.
        read = connectorx.read_sql(_url(dsn), sql, return_type="arrow", pre_execution_query=setup)
    except RuntimeError as exc:
        raise _translated(exc, table) from exc
    if not read.num_rows:
        return
    position = read.column(read.num_columns - 1)[0].as_py()
    if not position or ":" not in position:
        raise SourceError("the source reports no binlog_snapshot_file/position: the chunked copy needs"
                          " MariaDB (10.0 or later) with the binary log on (log_bin in my.cnf)")
    file, _, offset = position.rpartition(":")
    columns = [post(read.column(i)) if post is not None else read.column(i).cast(pa.string())
               for i, (_expression, post) in enumerate(plan)]
    columns.append(pa.repeat(pa.scalar(to_int(file, int(offset), epoch), pa.int64()), read.num_rows))
    yield from pa.Table.from_arrays(columns, schema=out_schema).to_batches(max_chunksize=batch_rows)


def _translated(exc: RuntimeError, table: TableName) -> Exception:
    """connectorx's error as the pymysql path raises it: transient when the chunk can be read again."""
    message = str(exc)
    if _TABLE_DEF_CHANGED in message or "definition has changed" in message:
        return TransientError(f"table {table} was altered while its chunk was copied; the chunk is copied again")
    if any(s in message for s in _LOST):
        return TransientError(f"the connection copying {table} was lost ({message}); the chunk is copied again")
    return exc
