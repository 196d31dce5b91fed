"""History modes beside the mirror: changelog, SCD type 2 and soft deletes (docs/history.md)."""
