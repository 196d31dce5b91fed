"""Only the optional C helpers of capture's per-change path (``headrace/_speedups.c``); everything
else is in pyproject.toml. ``optional=True``: without a C compiler the install still succeeds and
headrace runs its pure-Python code instead (same results, slower capture).

In a checkout: ``python setup.py build_ext --inplace`` (``pip install -e .`` builds it too).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("headrace._speedups", ["headrace/_speedups.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   # MySQL/MariaDB binlog row events (headrace.source.mysql.rows_native)
                   Extension("headrace._binlog_rows", ["headrace/_binlog_rows.c"], optional=True,
                             extra_compile_args=["-O2"])])
