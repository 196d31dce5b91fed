"""Only the optional C helpers (capture's per-change path, the initial copy's binary COPY decoder, MySQL
row events); everything else is in pyproject.toml. ``optional=True``: without a C compiler the install
still succeeds and headrace runs its other code instead (same results, more CPU).

In a checkout: ``python setup.py build_ext --inplace`` (``pip install -e .`` builds it too).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("headrace._speedups", ["headrace/_speedups.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   # the initial copy's binary COPY into Arrow (headrace.source.postgres.binary_copy)
                   Extension("headrace._copy_binary", ["headrace/_copy_binary.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   # MySQL/MariaDB binlog row events (headrace.source.mysql.rows_native)
                   Extension("headrace._binlog_rows", ["headrace/_binlog_rows.c"], optional=True,
                             extra_compile_args=["-O2"])])
