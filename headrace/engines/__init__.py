"""The two engines a unit of work runs on (``core.lanes``), one package each.

- ``engines.spark``: Spark jobs, in local mode on this machine's cores or on a cluster's executors:
  the session (``session``, started on demand by ``on_demand``), the casts from a source's text
  (``casts``, the reference every other cast must agree with), a batch's build (``batch``), keyless
  net changes (``keyless``) and the copy as Spark jobs (``copy``).
- ``engines.driver``: DuckDB and pyarrow in this process: a batch's build (``batch``) with its casts
  (``casts``), a table's keys held between batches (``key_rows``), the copy on the driver's threads
  (``copy``).
- ``engines.chunks``: a copy chunk in the row shape, built with pyarrow and written as Parquet: the work
  of one chunk, which a Spark task and a driver thread both do.

``materialize.lanes`` decides which engine runs what. Each change rule has one function per engine
under the same name (``engines.spark.batch`` and ``engines.driver.batch``: ``position_after``,
``key_changes``, ``last_change_per_key``, ``toast_fill``); ``tests/engines`` feeds both the same staged files
and compares. The engines import ``core``, the staged log's format (``log``) and a source's chunk
reader (``source.base``), never each other's modules (a copy chunk alone is cast by the driver's
casts wherever it runs, a Spark task included), the materializer, the run or a target
(``tests/run/test_layering.py``).
"""
