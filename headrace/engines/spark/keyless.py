"""Tables without a key: a batch of row images folded into the multiset delta a target applies.

Identical rows are legitimate in a table without a key (REPLICA IDENTITY FULL), so its changes
cannot be keyed: the materializer hands a target one row image per row a change adds (``I``) or
removes (``D``), and the target folds them with ``net_row_changes`` before applying them exactly
once (after dropping what it already holds, where it must).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from headrace.core.names import quote_spark
from headrace.core.rows import HR_COMMIT_TS, HR_DELTA, HR_LSN, HR_OP, HR_SEQ
from headrace.core.schema import TableSchema


def net_row_changes(images: DataFrame, table: TableSchema) -> DataFrame:
    """Fold a keyless batch (row images, ``headrace.engines.spark.batch``) into the multiset delta it makes.

    Per distinct row: one row with ``_hr_delta`` = -n when the batch removes n more copies than
    it adds, or one row with ``_hr_delta`` = 1 for each copy it adds net, carrying the position
    of the latest change that added that row. Rows the batch adds and removes equally vanish.
    """
    cols = [F.col(quote_spark(c.name)) for c in table.columns]
    sign = F.when(F.col(HR_OP) == "I", F.lit(1)).otherwise(F.lit(-1))
    added_at = F.when(F.col(HR_OP) == "I", F.struct(F.col(HR_LSN), F.col(HR_SEQ), F.col(HR_COMMIT_TS)))
    net = images.groupBy(*cols).agg(F.sum(sign).alias("_n"), F.max(added_at).alias("_at")).where(F.col("_n") != 0)
    copies = F.when(F.col("_n") > 0, F.sequence(F.lit(1), F.col("_n"))).otherwise(F.array(F.lit(1)))
    return net.select(
        *cols,
        F.col("_at")[HR_LSN].alias(HR_LSN),
        F.col("_at")[HR_SEQ].alias(HR_SEQ),
        F.col("_at")[HR_COMMIT_TS].alias(HR_COMMIT_TS),
        F.when(F.col("_n") > 0, F.lit(1)).otherwise(F.col("_n")).cast("int").alias(HR_DELTA),
        F.explode(copies).alias("_copy"),
    ).drop("_copy")
