"""An Iceberg REST catalog server for tests (``RestCatalogServer.java`` beside this file): compiled by
the installed JDK against the Iceberg runtime jar and started as a JVM of its own, over a JdbcCatalog
in a database of the session's PostgreSQL, its files on the session's object store through S3A. No
REST catalog server is installable here (docs/architecture.md); Iceberg's own tests serve the
protocol the same way, from the same handlers."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

import psycopg

from headrace.source.postgres.throwaway import ThrowawayPostgres
from headrace.storage.spark_conf import DEFAULT_FOLDER
from headrace.targets.iceberg.session import JDBC_DRIVER_JAR, iceberg_jars
from tests.objectstore import KEY_ID, SECRET, MotoServer, stop_process

SOURCE = Path(__file__).parent / "RestCatalogServer.java"
TOKEN = "rest-test-token-7d41"
CLIENT_ID, CLIENT_SECRET = "hr-client", "hr-client-secret-93ab"


def _classpath() -> list[str]:
    import pyspark

    spark_jars = Path(pyspark.__file__).parent / "jars"
    hadoop = [str(j) for j in sorted(spark_jars.glob("*.jar"))]
    s3a = [str(j) for j in sorted(DEFAULT_FOLDER.glob("*.jar"))]
    return [iceberg_jars()[0], JDBC_DRIVER_JAR, *s3a, *hadoop]


class RestCatalog:
    """The server, started on a free port; ``uri`` is what a client's ``uri`` setting takes."""

    def __init__(self, work: Path, pg: ThrowawayPostgres, s3: MotoServer, bucket: str) -> None:
        classes = work / "classes"
        classes.mkdir(parents=True, exist_ok=True)
        classpath = os.pathsep.join(_classpath())
        subprocess.run(["javac", "-nowarn", "-d", str(classes), "-cp", classpath, str(SOURCE)], check=True,
                       capture_output=True, timeout=180)
        database = f"restcat_{os.getpid()}"
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
            conn.execute(f'CREATE DATABASE "{database}"')
        self.warehouse = f"s3://{bucket}/rest"
        args = [
            "port=0", f"token={TOKEN}", f"client={CLIENT_ID}:{CLIENT_SECRET}",
            f"uri=jdbc:postgresql://127.0.0.1:{pg.port}/{database}", "jdbc.user=postgres",
            "jdbc.schema-version=V1", f"warehouse={self.warehouse}",
            "fs.s3.impl=org.apache.hadoop.fs.s3a.S3AFileSystem", f"fs.s3a.endpoint=127.0.0.1:{s3.port}",
            "fs.s3a.path.style.access=true", "fs.s3a.connection.ssl.enabled=false",
            "fs.s3a.endpoint.region=us-east-1", f"fs.s3a.access.key={KEY_ID}", f"fs.s3a.secret.key={SECRET}",
            "fs.s3a.aws.credentials.provider=org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        ]
        self._log = (work / "rest-catalog.log").open("w+")
        self.proc = subprocess.Popen(["java", "-Xmx512m", "-cp", f"{classes}{os.pathsep}{classpath}",
                                      "org.apache.iceberg.rest.RestCatalogServer", *args],
                                     stdout=subprocess.PIPE, stderr=self._log, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 120
        line = ""
        while not line.startswith("listening on "):
            line = self.proc.stdout.readline()
            if not line and (self.proc.poll() is not None or time.monotonic() > deadline):
                self.stop()
                raise RuntimeError(f"the REST catalog did not start: {(work / 'rest-catalog.log').read_text()[-2000:]}")
        self.port = int(line.split()[-1])
        self.uri = f"http://127.0.0.1:{self.port}"

    def fail_transactions(self, *statuses: int) -> None:
        """Make the next multi-table commits fail, one HTTP status each in order, committing nothing: 409
        as a refused requirement (a conflicting commit), any other as that HTTP error."""
        query = ",".join(str(s) for s in statuses)
        request = urllib.request.Request(f"{self.uri}/v1/test/fail-transactions?statuses={query}",
                                         method="POST", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 204

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()
