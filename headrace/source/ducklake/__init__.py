"""DuckLake as a source: a table's snapshots are its change log (fan-out pipelines)."""
