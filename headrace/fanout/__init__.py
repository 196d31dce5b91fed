"""Fan-out pipelines: one DuckLake table routed by a column to many tenant DuckLakes."""
