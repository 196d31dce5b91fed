"""dlt's ``sql_database`` copying one table into DuckDB: the peer in bench/initial_copy.py.

Runs in dlt's own virtualenv (bench/.venv-dlt, pinned in bench/dlt-requirements.txt), never in
headrace's: ``python bench/dlt_copy.py DSN TABLE OUT BACKEND CORES [OVERRIDES-JSON]``. Prints one
JSON line: dlt's own seconds per stage (from the pipeline's trace), the rows read back from DuckDB,
the column types it chose and the settings used.

Tuned as dlt documents it, for a fair race:
- pyarrow backend: ``chunk_size`` 100,000 rows (default 50,000): fewer, larger Arrow tables and
  Parquet files through extract and normalize.
- connectorx backend: binary protocol (dlt's default), the read split on the key into one partition
  per core (``partition_on``/``partition_num``, read in parallel by connectorx's native threads),
  streamed as Arrow record batches of ``chunk_size`` rows (``return_type: arrow_stream``) so a 50M-row
  table is never held in memory whole.
- both: Parquet load files; ``normalize.workers`` = cores; load jobs split by
  ``data_writer.file_max_items`` (1M rows a file) so the loader can run several (DuckDB itself uses every
  core); completed load packages deleted (disk).
"""

from __future__ import annotations

import json
import os
import sys
import time

CHUNK_ROWS = 100_000
FILE_ROWS = 1_000_000


def main() -> None:
    """Copy the table with the given backend; print seconds, stage times and rows read back."""
    dsn, table, out, backend, cores = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    # dlt reads its settings from the environment; set before dlt is imported.
    os.environ.update({"NORMALIZE__WORKERS": str(cores), "LOAD__WORKERS": str(max(2, cores)),
                       "DATA_WRITER__FILE_MAX_ITEMS": str(FILE_ROWS), "LOAD__DELETE_COMPLETED_JOBS": "true",
                       "RUNTIME__LOG_LEVEL": "ERROR"})
    started = time.monotonic()
    import dlt
    from dlt.sources.sql_database import sql_table

    kwargs: dict[str, object] = {"backend": backend, "chunk_size": CHUNK_ROWS}
    if backend == "connectorx":
        kwargs["backend_kwargs"] = {"return_type": "arrow_stream", "batch_size": CHUNK_ROWS,
                                    "partition_on": "id", "partition_num": cores}
    # dlt reflects the table through SQLAlchemy (psycopg2) whatever the backend; connectorx gets the
    # same URL without the driver part.
    credentials = dsn.replace("postgresql://", "postgresql+psycopg2://")
    if len(sys.argv) > 6:  # overrides, for tuning runs: {"chunk_size": ..., "backend_kwargs": {...}}
        for key, value in json.loads(sys.argv[6]).items():
            kwargs[key] = {**kwargs.get(key, {}), **value} if isinstance(value, dict) else value  # type: ignore[dict-item]
    pipe = dlt.pipeline(pipeline_name=f"bench_{backend}",
                        destination=dlt.destinations.duckdb(os.path.join(out, "dlt.duckdb")),
                        dataset_name="bench", pipelines_dir=os.path.join(out, "dlt-pipelines"))
    imported = time.monotonic()
    info = pipe.run(sql_table(credentials=credentials, table=table, **kwargs), loader_file_format="parquet")
    seconds = time.monotonic() - imported
    stages = {step.step: round((step.finished_at - step.started_at).total_seconds(), 2)
              for step in pipe.last_trace.steps if step.finished_at and step.started_at}
    with pipe.sql_client() as client:
        rows = client.execute_sql(f"SELECT count(*), sum(id) FROM {table}")[0]
        # The types dlt chose (numeric may not stay decimal on every backend): reported, for a fair read.
        types = dict(client.execute_sql("SELECT column_name, data_type FROM information_schema.columns "
                                        "WHERE table_name = ? AND column_name NOT LIKE '_dlt%'", table))
    print(json.dumps({"pipeline_s": round(seconds, 2), "import_s": round(imported - started, 2),
                      "stages": stages,
                      "rows": int(rows[0]), "sum_id": int(rows[1] or 0), "types": types,
                      "settings": kwargs,
                      "failed_jobs": info.has_failed_jobs}))


if __name__ == "__main__":
    main()
