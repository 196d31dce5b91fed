"""The row shape targets receive and write: the columns headrace adds beside the source columns.

Every target row carries the position of the change that last wrote it (``HR_LSN``, ``HR_SEQ``) and
that change's commit time; change batches add the operation and the TOAST columns an update left
unchanged (see ``headrace.core.interfaces.Target``). Shared by the materializer, which shapes the
rows, and every target, which stores them.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

# Metadata columns every target table carries beside the source columns.
HR_LSN = "_hr_lsn"  # commit LSN of the change that last wrote the row (bigint)
HR_SEQ = "_hr_seq"  # ordinal of that change inside its transaction (bigint)
HR_COMMIT_TS = "_hr_commit_ts"  # source commit time of that change (timestamp with time zone)
POSITION_COLUMNS = (HR_LSN, HR_SEQ, HR_COMMIT_TS)  # in this order after the source columns

# Columns of change batches only.
HR_OP = "_hr_op"  # I, U or D
HR_UNCHANGED = "_hr_unchanged"  # unchanged TOAST columns, comma-separated (``unchanged_token``)
HR_FROM = "_hr_from"  # in batches with key changes: the old key whose target row holds unchanged values
HR_DELTA = "_hr_delta"  # in net row changes of keyless tables: copies to add (+1 per row) or to remove (-n)


def unchanged_token(name: str) -> str:
    """Column ``name`` as it stands in a comma-separated list of unchanged TOAST columns (staged
    ``_unchanged_cols``, batches' ``HR_UNCHANGED``). A PostgreSQL column name may hold a comma, so
    '%' and ',' are percent-escaped; readers look a column up by its token, never split names back."""
    return name.replace("%", "%25").replace(",", "%2C")


def leaves_unchanged(changes: pa.Table) -> bool:
    """Some change of the batch ``changes`` leaves a TOAST column unchanged (a non-empty ``HR_UNCHANGED``)."""
    return HR_UNCHANGED in changes.column_names and any(pc.unique(changes.column(HR_UNCHANGED)).to_pylist())
