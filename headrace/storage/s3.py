"""One set of S3 settings, spelled for each engine that touches the files: ``pyarrow.fs`` (the
driver: staging, copy files, driver applies), Hadoop S3A (Spark's JVM), DuckDB's httpfs (DuckLake,
readers) and pyiceberg.

``S3Access`` is resolved once from the ``storage`` section and the standard AWS environment
variables; its ``repr`` leaves the secrets out, and nothing here logs.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from headrace.storage.config import StorageConfig

if TYPE_CHECKING:
    import duckdb
    import pyarrow.fs as pafs

SCHEMES = ("s3", "s3a")
DEFAULT_REGION = "us-east-1"


def is_object_store(location: str) -> bool:
    """``location`` is an ``s3://`` (or ``s3a://``) URI."""
    return urlparse(str(location)).scheme in SCHEMES


def split(location: str) -> tuple[str, str]:
    """(bucket, key prefix) of an ``s3://bucket/prefix`` location."""
    url = urlparse(location)
    return url.netloc, url.path.strip("/")


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _ip_or_localhost(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class S3Access:
    """Where the store is and who we are there (module docstring)."""

    endpoint: str | None  # scheme://host[:port], or None for AWS S3
    region: str
    path_style: bool
    key_id: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    # Which setting a wrong endpoint or key is fixed in (the config's, or the environment's).
    endpoint_setting: str = "storage.endpoint"
    key_setting: str = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"

    @classmethod
    def resolve(cls, config: StorageConfig | None = None) -> S3Access:
        """The access ``config`` gives, its unset parts from the standard AWS environment variables."""
        config = config or StorageConfig()
        endpoint = config.endpoint or _env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        endpoint = endpoint.rstrip("/") if endpoint else None
        host = urlparse(endpoint).hostname or "" if endpoint else ""
        path_style = config.path_style if config.path_style is not None else _ip_or_localhost(host)
        return cls(
            endpoint=endpoint,
            region=config.region or _env("AWS_REGION", "AWS_DEFAULT_REGION") or DEFAULT_REGION,
            path_style=path_style,
            key_id=_env(config.access_key_id_env),
            secret=_env(config.secret_access_key_env),
            token=_env(config.session_token_env),
            endpoint_setting="storage.endpoint" if config.endpoint else "storage.endpoint (or AWS_ENDPOINT_URL)",
            key_setting=f"{config.access_key_id_env} and {config.secret_access_key_env}",
        )

    @property
    def use_ssl(self) -> bool:
        return not self.endpoint or self.endpoint.startswith("https://")

    @property
    def host_port(self) -> str | None:
        """The endpoint without its scheme (``127.0.0.1:9000``), as S3A and DuckDB take it."""
        return self.endpoint.split("://", 1)[1] if self.endpoint else None

    @property
    def shown_endpoint(self) -> str:
        """The endpoint for messages."""
        return self.endpoint or f"AWS S3 ({self.region})"

    def secrets(self) -> list[str]:
        """The secret values, for the redaction tests and filters."""
        return [s for s in (self.secret, self.token) if s]

    # -- pyarrow.fs (the driver) -----------------------------------------------------------------
    def filesystem(self) -> pafs.S3FileSystem:
        """A ``pyarrow.fs.S3FileSystem`` on this store (picklable: a Spark task can write with it)."""
        import pyarrow.fs as pafs

        scheme = "https" if self.use_ssl else "http"
        return pafs.S3FileSystem(
            access_key=self.key_id if self.key_id and self.secret else None,
            secret_key=self.secret if self.key_id and self.secret else None,
            session_token=self.token if self.key_id and self.secret else None,
            region=self.region, endpoint_override=self.host_port, scheme=scheme,
            force_virtual_addressing=not self.path_style and self.endpoint is not None,
            connect_timeout=5, request_timeout=30,
            # a staged or table file smaller than an upload part goes up in one PUT, not three requests
            # (create, part, complete) and a round trip at open; a failure then shows at close, which
            # every writer here waits for
            allow_delayed_open=True,
        )

    # -- boto3 (the staged files' garbage collection) -----------------------------------------------
    def client(self) -> Any:
        """A boto3 S3 client on this store, for what ``pyarrow.fs`` lacks: deleting many keys in one
        request (``delete_keys``)."""
        import boto3
        from botocore.config import Config

        credentials = {"aws_access_key_id": self.key_id, "aws_secret_access_key": self.secret,
                       "aws_session_token": self.token} if self.key_id and self.secret else {}
        config = Config(region_name=self.region, connect_timeout=5, read_timeout=30,
                        retries={"max_attempts": 3, "mode": "standard"},
                        s3={"addressing_style": "path" if self.path_style else "virtual"})
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint, config=config, **credentials)

    # -- Hadoop S3A (Spark's JVM) ----------------------------------------------------------------
    def hadoop_conf(self) -> dict[str, str]:
        """Hadoop settings (without ``spark.hadoop.``) that make ``s3://`` and ``s3a://`` this store."""
        conf = {
            "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "fs.s3a.endpoint.region": self.region,
            "fs.s3a.path.style.access": str(self.path_style).lower(),
            "fs.s3a.connection.ssl.enabled": str(self.use_ssl).lower(),
            # An unreachable store fails a job in seconds (the pipeline's backoff retries it), not
            # after S3A's default of 20 attempts with growing waits.
            "fs.s3a.attempts.maximum": "3",
            "fs.s3a.retry.limit": "3",
            "fs.s3a.connection.establish.timeout": "5000",
            # S3A deleted the parent folders' markers after every file it wrote: a bulk DELETE per
            # manifest, manifest list and metadata file, ~4-5 a batch (moto, 2026-11-28). Keeping them
            # is safe for Hadoop 3.3.1+ and 3.2.2+ clients (HADOOP-13230), which Spark 3.5 brings.
            "fs.s3a.directory.marker.retention": "keep",
        }
        if self.endpoint:
            conf["fs.s3a.endpoint"] = self.host_port or ""
        if self.key_id and self.secret:
            conf["fs.s3a.access.key"] = self.key_id
            conf["fs.s3a.secret.key"] = self.secret
            if self.token:
                conf["fs.s3a.session.token"] = self.token
                conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            else:
                conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        return conf

    # -- DuckDB httpfs ---------------------------------------------------------------------------
    def create_duckdb_secret(self, con: duckdb.DuckDBPyConnection, name: str = "headrace_s3") -> None:
        """Load httpfs into ``con`` and give it this store as a (temporary, in-memory) S3 secret."""
        from headrace.targets.ducklake.extension import load_extension

        load_extension(con, "httpfs", "an s3:// location")
        options: dict[str, object] = {
            "TYPE": "s3", "REGION": self.region, "URL_STYLE": "path" if self.path_style else "vhost",
            "USE_SSL": self.use_ssl,
        }
        if self.endpoint:
            options["ENDPOINT"] = self.host_port
        if self.key_id and self.secret:
            options.update(KEY_ID=self.key_id, SECRET=self.secret)
            if self.token:
                options["SESSION_TOKEN"] = self.token
        else:
            options["PROVIDER"] = "credential_chain"
        parts = [f"{k} {_duckdb_value(v)}" for k, v in options.items()]
        con.execute(f"CREATE OR REPLACE TEMPORARY SECRET {name} ({', '.join(parts)})")
        # every file headrace reads on the store is written once under a name never reused (staged files,
        # table data and delete files): what DuckDB learnt of one (its size, its footer, its bytes) stays
        # true, so it asks the store again for none of them
        con.execute("SET enable_http_metadata_cache = true")
        con.execute("SET parquet_metadata_cache = true")
        con.execute("SET validate_external_file_cache = 'NO_VALIDATION'")

    # -- pyiceberg ---------------------------------------------------------------------------------
    def pyiceberg_properties(self) -> dict[str, str]:
        """``s3.*`` catalog properties for pyiceberg (its PyArrowFileIO)."""
        props = {"s3.region": self.region, "s3.force-virtual-addressing": str(not self.path_style).lower()}
        if self.endpoint:
            props["s3.endpoint"] = self.endpoint
        if self.key_id and self.secret:
            props.update({"s3.access-key-id": self.key_id, "s3.secret-access-key": self.secret})
            if self.token:
                props["s3.session-token"] = self.token
        return props


def _duckdb_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "'" + str(value).replace("'", "''") + "'"
