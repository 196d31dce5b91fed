"""The ``target: {ducklake: ...}`` section: a catalog database plus a data path for Parquet files."""

from __future__ import annotations

from pydantic import Field, model_validator

from headrace.core.settings import Frozen


class DuckLakeConfig(Frozen):
    """A DuckLake: catalog database plus a data path for Parquet files."""

    catalog: str | None = Field(
        None, description="DuckDB file path, sqlite:/path/meta.sqlite, or postgres:<libpq conninfo>"
    )
    catalog_env: str | None = Field(None, description="environment variable holding the catalog string")
    data_path: str = Field(description="folder the DuckLake writes its Parquet files to")
    schema_: str | None = Field(None, alias="schema", description="target schema; default: source schema")
    inline_rows: int = Field(
        1_000, ge=0, description="a change batch's insert (or delete from one data file) of at most this many"
        " rows is written into the catalog instead of a Parquet file (DuckLake's data inlining); a table's"
        " inlined rows go to one Parquet file once about 50,000 have gathered, and at each maintenance pass."
        " A stream of small batches then adds no file a batch, which every later batch would read until a"
        " compaction (targets/ducklake/inlining.py); 0: every batch writes its files"
    )
    driver_key_rows: int = Field(
        20_000_000, ge=0, description="keyed tables (one integer key column) of 100,000 up to this many rows"
        " keep their keys in memory between batches (key, rowid, _hr_lsn, _hr_seq: ~33 bytes a row, ~660 MB"
        " at the default, all tables together, least recently applied out first), so a batch finds its rows"
        " without scanning the table's key column (targets/ducklake/kept_keys.py); 0: always the scan"
    )

    @model_validator(mode="after")
    def _one_catalog(self) -> DuckLakeConfig:
        if (self.catalog is None) == (self.catalog_env is None):
            raise ValueError("ducklake needs exactly one of: catalog, catalog_env")
        return self
