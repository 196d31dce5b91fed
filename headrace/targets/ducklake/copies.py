"""Initial copies written on the driver, several tables to one DuckLake commit (``group``).

Each DuckLake commit costs more the more tables the lake holds (the next statement reloads the
catalog): measured on our 2-core machine under load, 200 tables of 1,000 rows took 40 s committed
one by one, 13 s four to a commit, 5 s eight to a commit. So a copy thread that brings its rows
while another thread's commit runs leaves them in the target's queue, and the next thread to take
the target's lock commits every copy waiting, each table's steps as alone
(``DuckLakeTarget.write_snapshot_arrow``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from headrace.core.schema import TableSchema


@dataclass(frozen=True, eq=False)
class CopyWrite:
    """One table's copied rows waiting for a commit (which gives the rows the table then holds)."""

    table: TableSchema
    rows: pa.Table
    replace: bool
