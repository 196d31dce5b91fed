"""The ``target: {iceberg: ...}`` section: a warehouse and the catalog that tracks its tables."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator

from headrace.core.errors import ConfigError
from headrace.core.settings import Frozen, from_env


class IcebergCatalogConfig(Frozen):
    """Which Iceberg catalog keeps track of the tables (docs/targets/iceberg.md)."""

    type: Literal["hadoop", "jdbc", "rest"] = Field(
        "hadoop", description="hadoop: metadata files on the warehouse path only (no server; cannot rename"
        " tables, and Iceberg advises against it in production); jdbc: Iceberg's JDBC catalog, a table of"
        " current metadata locations in a PostgreSQL database, readable by pyiceberg, Trino, Flink, ...;"
        " rest: an Iceberg REST catalog server (Polaris, Lakekeeper, Nessie, Unity, Glue's endpoint, ...)"
    )
    uri: str | None = Field(
        None, description="jdbc: the catalog database, as a URL (postgresql://user@host:5432/lakecat) or a"
        " libpq conninfo; a password is better given through uri_env or PGPASSWORD. rest: the server's base"
        " URL (http://host:8181/api/catalog; the client adds /v1/...)"
    )
    uri_env: str | None = Field(None, description="jdbc or rest: environment variable holding the uri")
    token_env: str | None = Field(
        None, description="rest: environment variable holding a bearer token sent with every request"
    )
    credential_env: str | None = Field(
        None, description="rest: environment variable holding OAuth2 client credentials, client_id:client_secret,"
        " exchanged for a token at oauth2_server_uri"
    )
    oauth2_server_uri: str | None = Field(
        None, description="rest: the OAuth2 token endpoint; unset: the catalog's <uri>/v1/oauth/tokens"
    )
    scope: str | None = Field(None, description="rest: the OAuth2 scope asked for (PRINCIPAL_ROLE:ALL on Polaris)")

    @model_validator(mode="after")
    def _uri_for_jdbc(self) -> IcebergCatalogConfig:
        given = self.uri is not None or self.uri_env is not None
        if self.type in ("jdbc", "rest") and (self.uri is None) == (self.uri_env is None):
            raise ValueError(f"catalog type {self.type} needs exactly one of: uri, uri_env")
        if self.type == "hadoop" and given:
            raise ValueError("catalog type hadoop takes no uri (it lives on the warehouse path); set type: jdbc")
        rest_only = [n for n in ("token_env", "credential_env", "oauth2_server_uri", "scope") if getattr(self, n)]
        if self.type != "rest" and rest_only:
            raise ValueError(f"{', '.join(rest_only)}: only for catalog type rest")
        if self.token_env and self.credential_env:
            raise ValueError("catalog type rest takes token_env or credential_env, not both")
        return self

    def rest_auth(self) -> dict[str, str]:
        """The REST catalog's secret properties (``token`` or ``credential``) read from the environment."""
        auth: dict[str, str] = {}
        for name, key in ((self.token_env, "token"), (self.credential_env, "credential")):
            if name:
                value = os.environ.get(name)
                if not value:
                    raise ConfigError(f"target.iceberg.catalog.{key}_env: environment variable {name} is not"
                                      " set; export it before running")
                auth[key] = value
        return auth

    def resolved_uri(self) -> str:
        """The JDBC catalog's database (from ``uri`` or the variable ``uri_env`` names)."""
        uri = from_env(self.uri, self.uri_env, "target.iceberg.catalog.uri")
        if not uri:
            raise ConfigError(f"target.iceberg.catalog: type {self.type} needs uri (or uri_env)")
        return uri


class IcebergConfig(Frozen):
    """An Iceberg warehouse and the catalog that tracks its tables."""

    warehouse: str = Field(
        description="warehouse root: a local path, s3://bucket/prefix (the storage section says how to reach"
        " it) or any Hadoop filesystem URI; with a REST catalog, the warehouse name or location the server"
        " expects (its tables' files are where the server puts them)")
    namespace: str | None = Field(None, description="namespace of the target tables; default: source schema")
    catalog_name: str = Field(
        "headrace", description="name under which the catalog is registered in Spark; a JDBC catalog's rows"
        " carry it, so other readers (pyiceberg's SqlCatalog) must use the same name"
    )
    catalog: IcebergCatalogConfig = Field(
        IcebergCatalogConfig(), description="the catalog; default: a Hadoop catalog on the warehouse path"
    )
    copy_on_write_below_rows: int = Field(
        100_000, ge=0, description="a keyed table with fewer rows is written copy-on-write (no delete files,"
        " a constant cost per batch), a larger one merge-on-read (back to copy-on-write only below this"
        " again, to merge-on-read from twice it); 0: always merge-on-read (see targets/iceberg/write_mode.py)"
    )
    apply_on_driver: bool = Field(
        True, description="batches built on the driver are applied there, no Spark job: into a copy-on-write"
        " table pyarrow and DuckDB read it and one Parquet file replaces it (targets/iceberg/driver_apply.py);"
        " into a merge-on-read one its keys are read and a position-delete file and a data file are committed"
        " (driver_delta.py); false: every batch is a Spark MERGE"
    )
    driver_key_rows: int = Field(
        20_000_000, ge=0, description="merge-on-read tables of up to this many rows are applied on the driver"
        " with their keys kept in memory between batches (key, _hr_lsn, _hr_seq, file and row number: ~36"
        " bytes a row for a bigint key, ~720 MB at the default, all tables together, least recently applied"
        " out first); a larger table too when its integer key's batch range falls in files of at most this"
        " many rows (read for each batch); otherwise Spark's MERGE. Raise it for larger tables, memory allowing"
    )
