"""The driver engine: DuckDB and pyarrow in this process, no Spark job (``engines``)."""
