"""Tables without a key on the driver: a batch of row images folded into the multiset delta a target
applies, by DuckDB (``engines.spark.keyless`` is Spark's, under the same name).

The fold groups rows by every column: DuckDB and Spark group NULLs alike, so the lane decision
(``materialize.lanes``) keeps tables with floating-point columns on Spark, whose grouping of NaN and
-0.0 is its own.
"""

from __future__ import annotations

import pyarrow as pa

from headrace.core.names import quote_ident
from headrace.core.rows import HR_COMMIT_TS, HR_DELTA, HR_LSN, HR_OP, HR_SEQ
from headrace.core.schema import TableSchema
from headrace.engines.driver.casts import connection


def net_row_changes(images: pa.Table, table: TableSchema) -> pa.Table:
    """Fold a keyless batch (row images, ``engines.driver.batch.row_images``) into the multiset delta
    it makes, in this thread's DuckDB (``engines.driver.casts.connection``).

    Per distinct row: one row with ``_hr_delta`` = -n when the batch removes n more copies than
    it adds, or one row with ``_hr_delta`` = 1 for each copy it adds net, carrying the position
    of the latest change that added that row. Rows the batch adds and removes equally vanish.
    """
    con = connection()
    cols = ", ".join(quote_ident(c.name) for c in table.columns)
    con.register("hr_images", images)
    try:
        result = con.execute(f"""
WITH net AS (
  SELECT {cols}, CAST(sum(CASE WHEN {HR_OP} = 'I' THEN 1 ELSE -1 END) AS BIGINT) AS hr_n,
         max(CASE WHEN {HR_OP} = 'I' THEN struct_pack(l := {HR_LSN}, s := {HR_SEQ}, t := {HR_COMMIT_TS}) END) AS hr_at
  FROM hr_images GROUP BY {cols} HAVING hr_n <> 0
)
SELECT {cols}, hr_at.l AS {HR_LSN}, hr_at.s AS {HR_SEQ}, hr_at.t AS {HR_COMMIT_TS},
       CAST(CASE WHEN hr_n > 0 THEN 1 ELSE hr_n END AS INTEGER) AS {HR_DELTA}
FROM net, unnest(CASE WHEN hr_n > 0 THEN range(hr_n) ELSE [0] END) AS copies(hr_copy)
""").arrow()
        return result if isinstance(result, pa.Table) else result.read_all()  # read before the unregister
    finally:
        con.unregister("hr_images")
