# The two set-up commands of the README: `make demo` and `make test`. Both install what they need.
.PHONY: bootstrap demo test test-all test-pg18 test-fast lint docs docs-serve bench

bootstrap:
	@bash scripts/bootstrap.sh

# make demo STORAGE=s3: the demo's staging and table files on a throwaway object store (moto_server).
demo: bootstrap
	.venv/bin/headrace demo $(if $(STORAGE),--storage $(STORAGE))

lint:
	@bash scripts/bootstrap.sh --with-browser
	.venv/bin/ruff check headrace tests bench scripts
	.venv/bin/mypy
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet

# The documentation site (mkdocs.yml) into site/: open site/index.html. Warnings are errors: a broken
# link or anchor, a page left out of the nav. The configuration and CLI references are generated from
# the code at every build (scripts/docs_reference.py). `make lint`, so `make test`, builds it too (~10 s).
docs: bootstrap
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

docs-serve: bootstrap
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs serve

# --durations: every run (CI's too) lists its slowest tests, to see where the suite's time goes.
# Two workers (pytest-xdist), a test file each at a time (--dist loadfile: a file's tests run in order on
# one worker; tests/control/test_api.py's build on each other's changes): the session fixtures
# (PostgreSQL server, Spark session) start once per worker. (--dist loadgroup does not group on pytest 9.)
# Tests marked slow (by hand: over ~20 s each, and covered in a lighter form by a test that does run)
# are left to `make test-all`, to keep `make test` (CI) under 20 minutes on an idle 2-core machine.
test: lint
	.venv/bin/pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25 -m "not slow" tests

test-all: lint
	.venv/bin/pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25 tests

# The crash, outage (source, state, catalog, object store), signal, transient-failure, copy and cluster
# kill tests with every source on PostgreSQL 18 (issue 41: the same guarantees on 15 and 18; make test runs
# one test of each family on 18, tests/e2e/test_pg18.py). 30 tests, about 5 minutes; CI (.ci/run) runs it
# after make test.
test-pg18: bootstrap
	HEADRACE_TEST_PG=18 .venv/bin/pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=10 \
		-m "not slow" tests/e2e/test_crash.py tests/e2e/test_crash_points.py \
		tests/e2e/test_outage.py tests/e2e/test_transient.py tests/e2e/test_signals.py \
		tests/e2e/test_large_transactions.py tests/e2e/test_initial_copy.py tests/e2e/test_object_storage_outage.py \
		tests/e2e/test_cluster.py

# The unit tier only (no Spark session, no pipeline run; tiers: tests/conftest.py): under a minute.
test-fast: bootstrap
	.venv/bin/pytest -q -p no:cacheprovider -m unit tests

bench: bootstrap
	.venv/bin/python bench/change_throughput.py
