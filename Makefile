# Two virtualenvs for the tests, one per supported Django line:
#   .venv      Python 3.11, Django 5.2 LTS + the django-tasks backport
#   .venv-dj61 Python 3.12+, Django 6.1 (django.tasks)
# and one for the example project (make worker), which needs nothing but Python:
#   .venv-example  Django 5.2 LTS, django-environ, a database driver only if DATABASE_URL asks
PY_DJ52 ?= python3
PY_DJ61 ?= $(shell ls -d $(HOME)/.pyenv/versions/3.13*/bin/python 2>/dev/null | tail -n1 || command -v python3.13 || command -v python3.12)
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
MYSQL_URL ?= mysql://root@127.0.0.1:3306/test
# The slowest tests of each run are listed, so a CI log shows where its time went.
PYTEST_ARGS ?= --durations=12

.PHONY: venvs sql test test-line test-libraries test-clusters test-quick test-stress lint worker bench clean

# mysqlclient (in the test extra, and for the example on MySQL) compiles from
# source: it needs these Debian packages, plus Python's headers.
MYSQLCLIENT_BUILD_DEPS = libmariadb-dev pkg-config gcc

# $(call need_packages,PACKAGES,PYTHON): install the Debian PACKAGES that are
# missing (and python3-dev if PYTHON has no headers) with apt-get when root, as
# .ci/run does; otherwise stop at once and print the command to run.
define need_packages
missing=""; \
if command -v dpkg >/dev/null; then \
  for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
  $(2) -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("include"), "Python.h")))' \
    || missing="$$missing python3-dev"; \
  if [ -z "$$missing" ]; then :; \
  elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
    echo "Installing$$missing (apt-get)"; \
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing || exit 1; \
  else \
    echo "mysqlclient needs system packages that are missing:$$missing. Run:" >&2; \
    echo "    sudo apt-get install -y$$missing" >&2; \
    exit 1; \
  fi; \
elif ! { command -v pkg-config >/dev/null && command -v cc >/dev/null \
         && { pkg-config --exists mysqlclient || pkg-config --exists libmariadb; }; }; then \
  echo "mysqlclient needs pkg-config, a C compiler and the MySQL client library." >&2; \
  echo "macOS:  brew install pkg-config mysql-client && export PKG_CONFIG_PATH=\"\$$(brew --prefix mysql-client)/lib/pkgconfig\"" >&2; \
  exit 1; \
fi
endef

.venv/.installed: pyproject.toml
	@$(call need_packages,$(MYSQLCLIENT_BUILD_DEPS),$(PY_DJ52))
	$(PY_DJ52) -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q "Django>=5.2,<5.3" -e ".[test,test-libraries]"
	touch $@

.venv-dj61/.installed: pyproject.toml
	@$(call need_packages,$(MYSQLCLIENT_BUILD_DEPS),$(PY_DJ61))
	$(PY_DJ61) -m venv .venv-dj61
	.venv-dj61/bin/pip install -q --upgrade pip
	.venv-dj61/bin/pip install -q "Django>=6.1,<6.2" -e ".[test,test-libraries,test-libraries-dj61]"
	touch $@

.venv-example/.installed: pyproject.toml
	$(PY_DJ52) -m venv .venv-example
	.venv-example/bin/pip install -q --upgrade pip
	.venv-example/bin/pip install -q "Django>=5.2,<5.3" -e ".[example]"
	touch $@

venvs: .venv/.installed .venv-dj61/.installed

# docs/sql/<database>.sql: every statement as the code builds it (db/catalog.py),
# checked by tests/test_sql_catalog.py. Run after changing a statement on purpose.
sql: .venv/.installed
	.venv/bin/python -c "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'tests.settings'); django.setup(); from django_rdbtasks.db.catalog import write_all; write_all()"

lint: .venv/.installed
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	cd example_project && ../.venv/bin/python manage.py makemigrations --check --dry-run
	cd example_project && ../.venv-dj61/bin/python manage.py makemigrations --check --dry-run

# The whole matrix: every database on both Django lines. A database that is
# unreachable fails the run; nothing is skipped for lack of one. The slow
# multi-process tests (races, crashes, restarts: the worker engine, which does
# not depend on the Django line) run once per database: SQLite and PostgreSQL
# on Django 5.2, MariaDB on Django 6.1 (so the two streams take about as long;
# with all three on 5.2 its stream alone took 40 minutes). Every other test
# runs on both lines. Two streams side by side, each in databases of its own,
# the Django 6.1 one followed by the cluster tests (servers of their own, on
# their own ports). The tests that restart the shared servers run last, alone.
test: venvs lint
	@command -v chromium >/dev/null || [ -n "$$RDBTASKS_CHROMIUM" ] \
	  || if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "No chromium: the browser tests will be skipped (sudo apt-get install -y chromium)"; fi
	.venv/bin/python scripts/check_databases.py "$(PG_URL)" "$(MYSQL_URL)"
	@bash -c 'set -o pipefail; logs=$$(mktemp -d); \
	  { { RDBTASKS_TEST_DB=test_rdbtasks $(MAKE) --no-print-directory test-line VENV=.venv \
	      MARKS="not server_restart" URLS="sqlite $(PG_URL)" \
	    && RDBTASKS_TEST_DB=test_rdbtasks $(MAKE) --no-print-directory test-line VENV=.venv \
	      MARKS="not slow" URLS="$(MYSQL_URL)" \
	    && RDBTASKS_TEST_DB=test_rdbtasks $(MAKE) --no-print-directory test-libraries VENV=.venv; } \
	    2>&1 | sed -u "s/^/[django 5.2] /" | tee $$logs/five; } & five=$$!; \
	  { { RDBTASKS_TEST_DB=test_rdbtasks_dj61 $(MAKE) --no-print-directory test-line \
	      VENV=.venv-dj61 MARKS="not slow" URLS="sqlite $(PG_URL)" \
	    && RDBTASKS_TEST_DB=test_rdbtasks_dj61 $(MAKE) --no-print-directory test-line \
	      VENV=.venv-dj61 MARKS="not server_restart" URLS="$(MYSQL_URL)" \
	    && RDBTASKS_TEST_DB=test_rdbtasks_dj61 $(MAKE) --no-print-directory test-libraries \
	      VENV=.venv-dj61 \
	    && RDBTASKS_TEST_DB=test_rdbtasks_clusters $(MAKE) --no-print-directory test-clusters; } \
	    2>&1 | sed -u "s/^/[django 6.1] /" | tee $$logs/six; } & six=$$!; \
	  wait $$five; a=$$?; wait $$six; b=$$?; \
	  echo "Django 5.2 stream: exit $$a; Django 6.1 stream and clusters: exit $$b"; \
	  grep -hE "^\[django [0-9.]+\] (=== |FAILED |ERROR |=+ .* in [0-9.]+s)" $$logs/five $$logs/six; \
	  rm -rf $$logs; \
	  [ $$a = 0 ] && [ $$b = 0 ]'
	for url in "$(PG_URL)" "$(MYSQL_URL)"; do \
	  DATABASE_URL=$$url .venv/bin/pytest -m server_restart $(PYTEST_ARGS) || exit 1; \
	done

# One Django line (VENV) over the databases of URLS (all three unless given),
# the tests MARKS selects, then example_project's own tests (docs/testing.md);
# stops at the first database that fails.
URLS ?= sqlite $(PG_URL) $(MYSQL_URL)
test-line:
	@for url in $(URLS); do \
	  echo "=== $(VENV) $$url"; \
	  if [ "$$url" = sqlite ]; then u=; else u=$$url; fi; \
	  DATABASE_URL=$$u $(VENV)/bin/pytest -m "$(MARKS)" $(PYTEST_ARGS) || exit 1; \
	  echo "=== $(VENV) $$url: example_project's own tests"; \
	  (cd example_project && DATABASE_URL=$$u TEST_DATABASE_NAME=$${RDBTASKS_TEST_DB:-test_rdbtasks}_example \
	    ../$(VENV)/bin/pytest -q) || exit 1; \
	done

# Real libraries that declare tasks of their own (tests/libraries/, with the
# settings tests/settings_libraries.py, which install their apps): Wagtail on
# both lines, django-crontask and django-maintenance-tasks on Django 6.1. Their
# worker-process tests included (seconds each), on SQLite and PostgreSQL.
LIBRARY_URLS ?= sqlite $(PG_URL)
test-libraries:
	@for url in $(LIBRARY_URLS); do \
	  echo "=== $(VENV) $$url (libraries)"; \
	  if [ "$$url" = sqlite ]; then u=; else u=$$url; fi; \
	  DATABASE_URL=$$u $(VENV)/bin/pytest --ds tests.settings_libraries tests/libraries \
	    $(PYTEST_ARGS) || exit 1; \
	done

# Servers the cluster tests start themselves, from Debian's packages.
CLUSTER_PACKAGES = pgbouncer postgresql-15 galera-4 mariadb-server rsync patroni etcd-server haproxy

# The tests that start servers of their own (a PgBouncer, replicated
# PostgreSQL pairs, a Patroni cluster behind HAProxy, a three-node Galera
# cluster): once, on Django 5.2, PostgreSQL or MariaDB as each needs (one file
# per cluster). Missing packages are installed when root.
test-clusters: .venv/.installed
	@missing=""; for p in $(CLUSTER_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing || exit 1; \
	  else echo "The cluster tests need:$$missing (sudo apt-get install -y$$missing)" >&2; exit 1; fi; fi
	DATABASE_URL="$(PG_URL)" .venv/bin/pytest --clusters $(PYTEST_ARGS) tests/test_pgbouncer.py tests/test_failover.py \
	  tests/test_replica.py tests/test_patroni.py
	DATABASE_URL="$(MYSQL_URL)" .venv/bin/pytest --clusters $(PYTEST_ARGS) tests/test_galera.py

# Hunting flakes: the slow multi-process tests of each database STRESS_RUNS
# times over, with one CPU burner per core beside them (a loaded CI machine).
# Stops at the first failure; the burners die with it.
STRESS_RUNS ?= 3
test-stress: venvs
	@set -e; burners=""; \
	for _ in $$(seq $$(nproc)); do nice -n 5 $(PY_DJ52) -c 'while True: pass' & burners="$$burners $$!"; done; \
	trap 'kill $$burners 2>/dev/null' EXIT; \
	for run in $$(seq $(STRESS_RUNS)); do \
	  for url in sqlite "$(PG_URL)" "$(MYSQL_URL)"; do \
	    echo "=== stress run $$run, $$url"; \
	    if [ "$$url" = sqlite ]; then u=; else u=$$url; fi; \
	    DATABASE_URL=$$u .venv/bin/pytest -m slow -p no:randomly $(PYTEST_ARGS); \
	  done; \
	done

# SQLite on Django 5.2 only: the fast loop while developing.
test-quick: .venv/.installed
	.venv/bin/pytest -m "not slow" $(PYTEST_ARGS)

# The example project: create invoices (their e-mails enqueued in the same
# transactions), then run workers until Ctrl+C. DATABASE_URL picks the database;
# its driver is installed the first time it is needed (psycopg's binary wheel
# needs nothing else; mysqlclient compiles, its system packages are checked first).
worker: .venv-example/.installed
	@case "$(DATABASE_URL)" in \
	  postgres*|postgis*|pgsql*|psql*) \
	    .venv-example/bin/python -c "import psycopg" 2>/dev/null \
	      || .venv-example/bin/pip install -q -e ".[example,postgres]";; \
	  mysql*) \
	    .venv-example/bin/python -c "import MySQLdb" 2>/dev/null || { \
	      $(call need_packages,$(MYSQLCLIENT_BUILD_DEPS),.venv-example/bin/python); \
	      .venv-example/bin/pip install -q -e ".[example,mysql]"; };; \
	esac
	cd example_project && ../.venv-example/bin/python manage.py migrate -v0 \
	  && ../.venv-example/bin/python manage.py create_invoices \
	  && ../.venv-example/bin/python manage.py create_devices \
	  && ../.venv-example/bin/python manage.py runworkers --processes 2 --threads 4

clean:
	rm -rf .venv .venv-dj61 .venv-example tests/*.sqlite3 example_project/*.sqlite3*
