"""The MySQL/MariaDB source: connect, catalog and types, server checks, the chunked initial copy and the
binlog change stream (docs/mysql.md). The adapter to headrace's ``Source`` interface is ``source.py``."""
