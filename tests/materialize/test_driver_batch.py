"""Batches built by DuckDB on the driver equal Spark's, value for value, or go to Spark; and reach
Spark again (Iceberg's ``arrow_frame``) with every value unchanged.

The type matrix of the e2e test (every awkward PostgreSQL value, as PostgreSQL prints it for the
change stream) goes through both paths under each ``values.infinity`` policy, with and without a
target that keeps infinity; random batches of inserts, updates, deletes, key changes, unchanged
TOAST columns and truncates give the same Arrow table on both paths.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from headrace.core.changes import UNCHANGED, Value
from headrace.core.lanes import Lane, NotOnLane
from headrace.core.position import Position
from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
from headrace.core.spark_types import ValueRules
from headrace.engines.driver.batch import read_driver_batch
from headrace.engines.spark.batch import read_change_batch
from headrace.log.codec import StagingBuffer, encode_row, write_staging_file
from headrace.log.facts import FileFacts
from headrace.materialize.lanes import batch_build_lane
from headrace.source.postgres.catalog import read_table_schema
from headrace.targets.ducklake.files import to_arrow
from headrace.targets.iceberg.arrow_frame import arrow_frame
from headrace.targets.iceberg.shapes import batch_struct
from tests.e2e.test_type_matrix import CELLS, DDL, MATRIX

K = TypeKind


def _stage(path: Path, names: tuple[str, ...], changes: list[tuple[Any, ...]]) -> tuple[str, FileFacts]:
    """Write (op, lsn, seq, values or None, old_key JSON or None) as one staging file."""
    buf = StagingBuffer()
    for op, lsn, seq, values, old_key in changes:
        data, unchanged = encode_row(names, values) if values is not None else (None, None)
        buf.append(op, lsn, seq, 1_700_000_000_000_000 + lsn, 7, data, unchanged, old_key)
    write_staging_file(path, buf)
    return str(path), buf.facts


def _raw_type(t: pa.DataType) -> pa.DataType:
    """Dates and timestamps as their days / microseconds (infinity and BC have no Python value)."""
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_list(t):
        return pa.list_(_raw_type(t.value_type))
    return t


def _sorted(table: pa.Table, key: list[str]) -> list[dict[str, Any]]:
    raw = pa.schema([pa.field(f.name, _raw_type(f.type)) for f in table.schema])
    rows = table.cast(raw).to_pylist()
    return sorted(rows, key=lambda r: tuple((r[k] is None, r[k]) for k in key) + (r["_hr_op"],))


def _same_values(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and -0.0 told from 0.0 (floats compared by repr)."""
    if isinstance(a, float) and isinstance(b, float):
        return repr(a) == repr(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b, strict=True))
    return bool(type(a) is type(b) and a == b)


def _spark_arrow(spark: Any, paths: list[str], table: TableSchema, skip: Position | None, rules: ValueRules,
                 facts: list[FileFacts | None]) -> pa.Table:
    return to_arrow(read_change_batch(spark, paths, table, skip, rules, facts=facts).changes)


# -- the type matrix ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def matrix_texts(pg_server: Any) -> tuple[TableSchema, list[tuple[str, ...]]]:
    """The matrix table's schema and each row as PostgreSQL's text output in the replication session's
    settings (what pgoutput sends)."""
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS driver_matrix")
        conn.execute("CREATE DATABASE driver_matrix")
    dsn = pg_server.dsn_for("driver_matrix")
    columns = ", ".join(f"{name} {pg_type}" for name, (pg_type, _, _) in MATRIX.items())
    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in ("TimeZone = 'UTC'", "DateStyle = 'ISO, MDY'", "IntervalStyle = 'postgres'",
                        "extra_float_digits = 1", "bytea_output = 'hex'"):
            conn.execute(f"SET {setting}")
        conn.execute(DDL)
        conn.execute(f"CREATE TABLE matrix (id integer PRIMARY KEY, {columns})")
        for i, (column, value) in enumerate(CELLS, start=1):
            conn.execute(f"INSERT INTO matrix (id, {column}) VALUES ({i}, {value})")
        schema = read_table_schema(conn, "public.matrix")  # type: ignore[arg-type]
        texts = [f"CASE WHEN num_nulls({c}) = 0 THEN format('%s', {c}) END" for c in schema.column_names]
        rows = conn.execute(f"SELECT {', '.join(texts)} FROM matrix ORDER BY id").fetchall()
    return schema, rows


# DuckLake's rules (infinity kept) under the default policy, and the other policy without infinity.
RULES = [(True, "stop"), (False, "clamp")]


@pytest.mark.parametrize(("keep_infinity", "infinity"), RULES, ids=[f"keep={k}-{p}" for k, p in RULES])
def test_every_awkward_value_casts_as_spark_casts_it_or_goes_to_spark(
    spark: Any, tmp_path: Path, matrix_texts: tuple[TableSchema, list[tuple[str, ...]]], keep_infinity: bool,
    infinity: Any,
) -> None:
    schema, rows = matrix_texts
    rules = ValueRules("public.matrix", infinity, keep_infinity)
    names = schema.column_names
    driven, refused = [], []
    for n, texts in enumerate(rows):
        path, facts = _stage(tmp_path / f"row{n}.parquet", names, [("I", 100 + n, 1, texts, None)])
        assert batch_build_lane("auto", True, schema, [facts], 1000).lane is Lane.DRIVER
        try:
            driven.append(read_driver_batch([path], schema, None, rules, [facts]).changes)
        except NotOnLane as exc:
            refused.append((CELLS[n], str(exc)))
            continue
    ours = pa.concat_tables(driven)
    # Every row the driver took, through Spark in one batch (what the driver refused would make
    # Spark stop the whole batch under ``stop``).
    refused_cells = {c for c, _ in refused}
    taken = [("I", 100 + n, 1, r, None) for n, r in enumerate(rows) if CELLS[n] not in refused_cells]
    path, facts = _stage(tmp_path / "all.parquet", names, taken)
    theirs = _spark_arrow(spark, [path], schema, None, rules, [facts])
    assert ours.schema.names == theirs.schema.names
    assert [f.type for f in ours.schema] == [f.type for f in theirs.schema]
    problems = []
    for mine, spark_row in zip(_sorted(ours, ["id"]), _sorted(theirs, ["id"]), strict=True):
        for name in ours.schema.names:
            if not _same_values(mine[name], spark_row[name]):
                problems.append(f"row {mine['id']} {name}: driver {str(mine[name])[:60]!r}, spark"
                                f" {str(spark_row[name])[:60]!r}")
    assert not problems, "\n".join(problems)
    # Iceberg's route into Spark for the same rows (a local relation from the Arrow batches) keeps
    # every value bit for bit: read back through Spark, the driver's rows again.
    back = to_arrow(arrow_frame(spark, ours, batch_struct(schema)))
    assert [(f.name, f.type) for f in back.schema] == [(f.name, f.type) for f in ours.schema]
    assert all(_same_values(a[n], b[n]) for a, b in zip(_sorted(back, ["id"]), _sorted(ours, ["id"]), strict=True)
               for n in ours.schema.names)
    # What goes to Spark: only values outside the ordinary forms (BC and far-future dates and
    # timestamps, infinity on a target without it, NaN/Infinity in a fixed-scale array element...).
    fallback_columns = {cell[0] for cell, _ in refused}
    allowed = {"c_date", "c_ts", "c_tstz", "c_date_arr", "c_tstz_arr"}
    assert fallback_columns <= allowed, refused
    assert len(refused) <= (7 if keep_infinity else 14), refused


# -- random batches ----------------------------------------------------------------------------

INT = ColumnType(K.INT, "integer")
TEXT = ColumnType(K.STRING, "text")
TS = ColumnType(K.TIMESTAMPTZ, "timestamp with time zone")
TABLE = TableSchema(oid=7, schema="public", name="r",
                    columns=(Column("id", INT, 23), Column("name", TEXT, 25), Column("doc", TEXT, 25),
                             Column("at", TS, 1184)),
                    key=("id",))
KEYS = (1, 2, 3, 4, 5, 6)

def _random_intents(rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    """``n`` changes: (kind, key, other key, value, TOAST doc unchanged, new transaction)."""
    return [(rng.choice("IUUDKT" if rng.random() < 0.1 else "IUUDK"), rng.choice(KEYS), rng.choice(KEYS),
             rng.randint(0, 5), rng.random() < 0.4, rng.random() < 0.5) for _ in range(n)]


def _changes(intents: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Staged rows from intents (not a valid history: the paths must agree on any staged rows)."""
    out, lsn, seq = [], 100, 0
    for kind, key, other, value, toast, new_txn in intents:
        if new_txn:
            lsn, seq = lsn + 10, 0
        seq += 1
        doc: Value = UNCHANGED if toast else (None if value == 0 else f"doc{value}")
        at = f"2024-01-0{value + 1} 10:00:0{value}.5+00"
        match kind:
            case "I" | "U":
                out.append((kind, lsn, seq, (str(key), f"n{value}", doc, at), None))
            case "D":
                out.append(("D", lsn, seq, (str(key), None, None, None), None))
            case "K":  # a key change: never with TOAST unchanged here (that batch goes to Spark)
                out.append(("U", lsn, seq, (str(other), f"k{value}", f"doc{value}", at), json.dumps({"id": str(key)})))
            case "T":
                out.append(("T", lsn, seq, None, None))
    return out


# Seeded random batches (each is one Spark batch, the slow part, so each holds many cases: long
# change lists over few keys). Checked with the code broken on purpose: not carrying TOAST values,
# or ignoring the truncate, fails one of the seeds (each ~8 s).
SEEDS = [(1, 120, 7, 0), (2, 150, 40, 3), (3, 90, 1, 1), (4, 200, 200, 6)]


@pytest.mark.parametrize(("seed", "changes", "cut", "skip"), SEEDS, ids=[f"seed{s[0]}" for s in SEEDS])
def test_random_batches_give_the_same_arrow_table_on_both_paths(
    spark: Any, tmp_path: Path, seed: int, changes: int, cut: int, skip: int,
) -> None:
    staged = _changes(_random_intents(random.Random(seed), changes))
    files = [_stage(tmp_path / f"{i}.parquet", TABLE.column_names, staged[i:i + cut])
             for i in range(0, len(staged), cut)]
    paths, facts = [p for p, _ in files], [f for _, f in files]
    skip_through = Position(100 + 10 * skip, 0) if skip else None
    rules = ValueRules("public.r", "stop", True)
    assert batch_build_lane("auto", True, TABLE, facts, 1000).lane is Lane.DRIVER
    ours = read_driver_batch(paths, TABLE, skip_through, rules, facts)
    theirs = read_change_batch(spark, paths, TABLE, skip_through, rules, facts=facts)
    assert (ours.truncate_before, ours.rows_in, ours.values_changed) == \
        (theirs.truncate_before, theirs.rows_in, theirs.values_changed)
    spark_arrow = to_arrow(theirs.changes)
    assert isinstance(ours.changes, pa.Table)
    assert [f.type for f in ours.changes.schema] == [f.type for f in spark_arrow.schema]
    assert _sorted(ours.changes, ["id"]) == _sorted(spark_arrow, ["id"])


def test_batches_the_driver_does_not_build(tmp_path: Path) -> None:
    keyless = TableSchema(oid=8, schema="public", name="bag", columns=TABLE.columns, key=())
    floating = TableSchema(oid=9, schema="public", name="f", columns=(Column("x", ColumnType(K.DOUBLE, "float8"), 701),),
                           key=("x",))
    _, facts = _stage(tmp_path / "a.parquet", TABLE.column_names, [("I", 1, 1, ("1", "a", "b", None), None)])
    _, key_toast = _stage(tmp_path / "b.parquet", TABLE.column_names,
                          [("U", 1, 1, ("2", "a", UNCHANGED, None), json.dumps({"id": "1"}))])
    assert batch_build_lane("auto", True, TABLE, [facts], 1000).lane is Lane.DRIVER
    assert batch_build_lane("auto", True, TABLE, [facts], 0).detail == "apply.driver_batch_rows is 0"
    assert batch_build_lane("auto", True, TABLE, [facts, facts], 1).detail == "2 staged rows > apply.driver_batch_rows 1"
    assert batch_build_lane("auto", True, TABLE, [facts, None], 1000).detail == "files without registered facts"
    assert batch_build_lane("auto", True, keyless, [facts], 1000).lane is Lane.DRIVER
    bag = TableSchema(oid=11, schema="public", name="bag", columns=(*TABLE.columns, floating.columns[0]), key=())
    assert batch_build_lane("auto", True, bag, [facts], 1000).reason == "float-row"
    _, no_old = _stage(tmp_path / "c.parquet", TABLE.column_names, [("U", 1, 1, ("2", "a", "b", None), None)])
    assert batch_build_lane("auto", True, keyless, [no_old], 1000).reason == "no-old-row"
    assert batch_build_lane("auto", True, floating, [facts], 1000).detail == "floating-point key"
    assert batch_build_lane("auto", True, TABLE, [key_toast], 1000).detail == "a key change left TOAST columns unchanged"
    # The engine setting, and what the target declares.
    assert batch_build_lane("spark", True, TABLE, [facts], 1000).reason == "engine"
    assert batch_build_lane("driver", True, TABLE, [facts, facts], 1).lane is Lane.DRIVER  # no size bound
    assert batch_build_lane("driver", True, floating, [facts], 1000).lane is Lane.SPARK  # what it cannot do
    assert batch_build_lane("auto", False, TABLE, [facts], 1000).reason == "target"


def test_a_value_spark_refuses_sends_the_batch_to_spark_which_names_it(spark: Any, tmp_path: Path) -> None:
    path, facts = _stage(tmp_path / "a.parquet", TABLE.column_names,
                         [("I", 1, 1, ("1", "a", "b", "infinity"), None)])
    rules = ValueRules("public.r", "stop", keep_infinity=False)
    with pytest.raises(NotOnLane, match="column at"):
        read_driver_batch([path], TABLE, None, rules, [facts])
    with pytest.raises(Exception, match="public.r column at: value 'infinity' cannot be stored"):
        to_arrow(read_change_batch(spark, [path], TABLE, None, rules, facts=[facts]).changes)


def test_an_array_no_list_holds_falls_back_naming_column_and_value(tmp_path: Path) -> None:
    ints = ColumnType(K.LIST, "integer[]", element=INT)
    grid = TableSchema(oid=10, schema="public", name="grid", columns=(Column("id", INT, 23), Column("cells", ints, 1007)),
                       key=("id",))
    path, facts = _stage(tmp_path / "a.parquet", grid.column_names,
                         [("I", 1, 1, ("1", "{1,NULL,3}"), None), ("I", 1, 2, ("2", "{{1,2},{3,4}}"), None)])
    with pytest.raises(NotOnLane, match=r"^headrace-driver-fallback: column cells \(integer\[\]\) value \{\{1,2"):
        read_driver_batch([path], grid, None, ValueRules(), [facts])
    path, facts = _stage(tmp_path / "b.parquet", grid.column_names, [("I", 1, 1, ("1", "{1,NULL,3}"), None)])
    assert read_driver_batch([path], grid, None, ValueRules(), [facts]).changes.column("cells").to_pylist() == \
        [[1, None, 3]]
