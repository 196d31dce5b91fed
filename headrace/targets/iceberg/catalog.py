"""Iceberg catalogs: the Spark conf for a Hadoop or a JDBC catalog, and how other readers reach it.

A Hadoop catalog is only files on the warehouse path (``version-hint.text`` names the current
metadata file); it needs no server but cannot rename tables, and Iceberg advises against it in
production because it relies on an atomic rename of the filesystem. A JDBC catalog keeps one row
per table (catalog name, namespace, table, current metadata location) in a PostgreSQL database:
commits swap that row in a transaction, and any engine with the same catalog name finds the
tables (pyiceberg's ``SqlCatalog``, Trino, Flink, Spark).
"""

from __future__ import annotations

import getpass
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from psycopg.conninfo import conninfo_to_dict

from headrace import storage
from headrace.core.errors import ConfigError
from headrace.core.settings import redacted_dsn
from headrace.targets.iceberg.config import IcebergConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# libpq parameter -> pgjdbc parameter, for those both drivers know (others are refused, not dropped).
_JDBC_PARAMS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "connect_timeout": "connectTimeout",
    "application_name": "ApplicationName",
    "options": "options",
}
_ADDRESS = ("host", "hostaddr", "port", "dbname", "user", "password")


@dataclass(frozen=True)
class JdbcCatalogDatabase:
    """The JDBC catalog's PostgreSQL database, spelled for the Java driver and for libpq."""

    host: str
    port: int
    dbname: str
    user: str
    password: str | None
    params: dict[str, str]  # libpq spelling (sslmode, ...)

    @property
    def jdbc_url(self) -> str:
        """``jdbc:postgresql://host:port/db?...``, without credentials (they go in properties)."""
        query = urlencode({_JDBC_PARAMS[k]: v for k, v in self.params.items()})
        return f"jdbc:postgresql://{self._host_port}/{quote(self.dbname)}" + (f"?{query}" if query else "")

    @property
    def sqlalchemy_url(self) -> str:
        """The same database for pyiceberg's ``SqlCatalog`` (SQLAlchemy with psycopg2)."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        query = urlencode(self.params)
        return f"postgresql+psycopg2://{auth}@{self._host_port}/{quote(self.dbname)}" + (f"?{query}" if query else "")

    @property
    def shown(self) -> str:
        """For logs and errors: no password."""
        return redacted_dsn(f"postgresql://{quote(self.user, safe='')}@{self._host_port}/{self.dbname}")

    @property
    def _host_port(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def jdbc_database(uri: str) -> JdbcCatalogDatabase:
    """Parse the catalog's ``uri`` (a libpq URL or conninfo) the way libpq would, defaults included."""
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(uri).items() if v is not None}
    except Exception:  # psycopg's ProgrammingError; its message may echo the password
        raise ConfigError(
            "target.iceberg.catalog.uri is not a PostgreSQL URL or conninfo (expected e.g."
            " postgresql://user@host:5432/lakecat)"
        ) from None
    host = params.get("hostaddr") or params.get("host") or os.environ.get("PGHOST", "localhost")
    if host.startswith("/") or "," in host:
        raise ConfigError(
            f"target.iceberg.catalog.uri names host {host!r}: the JDBC driver Spark uses connects over TCP to"
            " one host only; give a host name or address (host=127.0.0.1)"
        )
    unknown = sorted(k for k in params if k not in _ADDRESS and k not in _JDBC_PARAMS)
    if unknown:
        raise ConfigError(
            f"target.iceberg.catalog.uri sets {', '.join(unknown)}, which the JDBC driver does not take;"
            f" remove them (supported besides the address: {', '.join(sorted(_JDBC_PARAMS))})"
        )
    user = params.get("user") or os.environ.get("PGUSER") or getpass.getuser()
    return JdbcCatalogDatabase(
        host=host,
        port=int(params.get("port") or os.environ.get("PGPORT", "5432")),
        dbname=params.get("dbname") or os.environ.get("PGDATABASE") or user,
        user=user,
        password=params.get("password") or os.environ.get("PGPASSWORD"),
        params={k: v for k, v in params.items() if k in _JDBC_PARAMS},
    )


HADOOP_FILE_IO = "org.apache.iceberg.hadoop.HadoopFileIO"


def spark_catalog_conf(settings: IcebergConfig, file_io: str | None = None) -> dict[str, str]:
    """The ``spark.sql.catalog.<name>.*`` settings that register the configured catalog. ``file_io``:
    the catalog's ``io-impl`` the session already holds (``session_catalog_conf``: the user's ``spark.conf``),
    kept."""
    prefix = f"spark.sql.catalog.{settings.catalog_name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": settings.catalog.type,
        f"{prefix}.warehouse": settings.warehouse,
        # Manifests never change once written: every batch's scan (``data_files.planned_files``) and
        # commit read the same ones again, on an object store a HEAD and a GET each (~4 a batch, on
        # moto 2026-11-28). Iceberg's own cache keeps them in the JVM (100 MB at most, Iceberg's default).
        f"{prefix}.io.manifest.cache-enabled": "true",
    }
    if settings.catalog.type == "rest":
        catalog = settings.catalog
        conf[f"{prefix}.uri"] = catalog.resolved_uri()
        # A REST catalog's default FileIO on s3:// is S3FileIO, which needs the AWS SDK v2 bundle on the
        # class path; Hadoop's S3A (the storage section) reaches the same files. A user with the bundle
        # names S3FileIO in spark.conf (no existence probes around each file: docs/benchmarks.md).
        conf[f"{prefix}.io-impl"] = file_io or HADOOP_FILE_IO
        if catalog.oauth2_server_uri:
            conf[f"{prefix}.oauth2-server-uri"] = catalog.oauth2_server_uri
        if catalog.scope:
            conf[f"{prefix}.scope"] = catalog.scope
        conf.update({f"{prefix}.{key}": value for key, value in catalog.rest_auth().items()})
    if settings.catalog.type == "jdbc":
        database = jdbc_database(settings.catalog.resolved_uri())
        conf[f"{prefix}.uri"] = database.jdbc_url
        conf[f"{prefix}.jdbc.user"] = database.user
        # V1 adds the iceberg_type column (views); pyiceberg's SqlCatalog reads V1 without a warning.
        conf[f"{prefix}.jdbc.schema-version"] = "V1"
        if database.password:
            # Spark redacts conf keys matching "password" wherever it shows its conf.
            conf[f"{prefix}.jdbc.password"] = database.password
    return conf


def session_catalog_conf(spark: SparkSession, settings: IcebergConfig) -> dict[str, str]:
    """``spark_catalog_conf`` for ``spark``'s session, keeping the FileIO its conf names for the catalog
    (the user's ``spark.conf``), if any."""
    return spark_catalog_conf(settings, spark.conf.get(f"spark.sql.catalog.{settings.catalog_name}.io-impl", None))


SECRET_KEYS = ("password", ".token", ".credential")  # catalog conf keys whose values are secrets


def pyiceberg_properties(settings: IcebergConfig) -> dict[str, str]:
    """Properties for ``pyiceberg.catalog.sql.SqlCatalog(settings.catalog_name, **properties)`` (a JDBC
    catalog), or for ``pyiceberg.catalog.load_catalog`` (a REST catalog: ``type`` is ``rest``)."""
    if settings.catalog.type == "rest":
        catalog = settings.catalog
        properties = {"type": "rest", "uri": catalog.resolved_uri(), "warehouse": settings.warehouse,
                      **catalog.rest_auth()}
        if catalog.oauth2_server_uri:
            properties["oauth2-server-uri"] = catalog.oauth2_server_uri
        if catalog.scope:
            properties["scope"] = catalog.scope
        properties.update(storage.access().pyiceberg_properties())
        return properties
    if settings.catalog.type != "jdbc":
        raise ConfigError(
            "pyiceberg has no Hadoop catalog: read a table of a Hadoop catalog with"
            " pyiceberg.table.StaticTable.from_metadata('<warehouse>/<namespace>/<table>/metadata/vN.metadata.json')"
        )
    database = jdbc_database(settings.catalog.resolved_uri())
    warehouse = settings.warehouse if "://" in settings.warehouse else f"file://{os.path.abspath(settings.warehouse)}"
    properties = {"uri": database.sqlalchemy_url, "warehouse": warehouse}
    if storage.is_object_store(warehouse):
        properties.update(storage.access().pyiceberg_properties())
    return properties


def java_table(spark: SparkSession, name: str) -> Any:
    """The Iceberg ``Table`` (a py4j object) the Spark catalog holds for ``name`` (quoted Spark name):
    the catalog's cached instance, so a commit through it is what Spark SQL sees next.

    Spark loads a catalog on first use with the conf of the thread's active session; a worker's JVM
    thread has none until a query sets it (Spark SQL sets it per query), and Iceberg's lookup then
    silently falls back to spark_catalog (the first apply batch after a restart failed so). So the
    session is made active first, for every lookup outside a query.
    """
    java = java_files(spark.sparkContext._jvm)
    session = spark._jsparkSession
    java.spark_session.setActiveSession(session)
    return java.spark3_util.loadIcebergTable(session, name)


class JavaFiles:
    """The Java classes a data file's commit (``files.data_file``) and each batch on the driver call,
    looked up once per JVM (``java_files``): through py4j each step of a dotted name is a round trip of
    its own."""

    def __init__(self, jvm: Any) -> None:
        api = jvm.org.apache.iceberg
        self.data_files = api.DataFiles
        self.parquet_util = api.parquet.ParquetUtil
        self.metrics_config = api.MetricsConfig
        self.footers = api.shaded.org.apache.parquet.hadoop.ParquetFileReader
        converter = api.shaded.org.apache.parquet.format.converter.ParquetMetadataConverter
        self.metadata_converter = converter()
        self.no_filter = converter.NO_FILTER
        self.bytes_in = jvm.java.io.ByteArrayInputStream
        self.path = jvm.org.apache.hadoop.fs.Path
        self.streams = jvm.java.util.stream.Stream
        # What every batch on the driver looks up (``java_table``, ``table_columns``, the commits).
        self.spark_session = jvm.org.apache.spark.sql.SparkSession
        self.spark3_util = api.spark.Spark3Util
        self.schema_parser = api.SchemaParser
        self.file_metadata = api.FileMetadata
        self.always_true = api.expressions.Expressions.alwaysTrue()


_java_files: dict[int, tuple[Any, JavaFiles]] = {}  # id(JVM view) -> (the view, its classes)


def java_files(jvm: Any) -> JavaFiles:
    """``JavaFiles`` of the JVM ``jvm`` (``spark.sparkContext._jvm``), looked up on first use."""
    held = _java_files.get(id(jvm))
    if held is None or held[0] is not jvm:
        held = _java_files[id(jvm)] = (jvm, JavaFiles(jvm))
    return held[1]


class JavaCatalog:
    """The Iceberg catalog inside Spark's catalog ``catalog_name``, and the Java classes a small table's
    copy calls (``files.create_with_rows``), looked up once: through py4j each lookup of a package, a
    class or the catalog is a round trip of its own, ~20 of the ~60 a copy made (issue 21). The
    catalog is the very instance Spark's catalog caches tables in, and Iceberg's catalogs are safe to
    call from several threads.
    """

    def __init__(self, spark: SparkSession, catalog_name: str) -> None:
        jvm: Any = spark.sparkContext._jvm
        self._gateway: Any = spark.sparkContext._gateway
        self._string = jvm.java.lang.String
        java_files(jvm).spark_session.setActiveSession(spark._jsparkSession)  # see java_table
        self.spark_catalog = spark._jsparkSession.sessionState().catalogManager().catalog(catalog_name)
        self.iceberg = self.spark_catalog.icebergCatalog()
        api = jvm.org.apache.iceberg
        self.table_identifier = api.catalog.TableIdentifier
        self.namespace = api.catalog.Namespace
        self.schema_util = api.spark.SparkSchemaUtil
        self.data_type = jvm.org.apache.spark.sql.types.DataType
        self.files = java_files(jvm)
        self.hash_map = jvm.java.util.HashMap
        self._namespaces: set[str] = set()  # made or found by ``ensure_namespace``
        self._namespaces_lock = threading.Lock()

    def identifier(self, namespace: str, name: str) -> Any:
        """Iceberg's ``TableIdentifier`` of table ``name`` in one-level ``namespace`` (names unquoted)."""
        return self.table_identifier.of(self.namespace.of(self.levels(namespace)), name)

    def levels(self, namespace: str) -> Any:
        """A one-level namespace as the Java ``String[]`` the catalogs take."""
        levels = self._gateway.new_array(self._string, 1)
        levels[0] = namespace
        return levels

    def java_map(self, values: dict[str, str]) -> Any:
        """``values`` as a ``java.util.HashMap``."""
        made = self.hash_map()
        for key, value in values.items():
            made.put(key, value)
        return made

    def ensure_namespace(self, namespace: str) -> None:
        """Create one-level ``namespace`` if missing, once a run, as ``CREATE NAMESPACE IF NOT EXISTS``
        does, without Spark SQL: a fresh session's first statement took ~1.4 s of the JVM (parser,
        analyzer). One thread at a time: two concurrent creations can both try."""
        from py4j.protocol import Py4JJavaError

        with self._namespaces_lock:
            if namespace in self._namespaces:
                return
            levels = self.levels(namespace)
            if not self.spark_catalog.namespaceExists(levels):
                try:
                    self.spark_catalog.createNamespace(levels, self.hash_map())
                except Py4JJavaError as exc:
                    if "AlreadyExists" not in str(exc.java_exception.getClass().getName()):
                        raise
            self._namespaces.add(namespace)
