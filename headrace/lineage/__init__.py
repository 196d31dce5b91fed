"""OpenLineage run events for each initial copy and each apply batch (or a summary per interval)."""
