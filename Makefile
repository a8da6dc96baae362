# Two virtualenvs, one per supported Django line:
#   .venv      Python 3.11, Django 5.2 LTS + the django-tasks backport
#   .venv-dj61 Python 3.12+, Django 6.1 (django.tasks)
PY_DJ52 ?= python3
PY_DJ61 ?= $(shell ls -d $(HOME)/.pyenv/versions/3.13*/bin/python 2>/dev/null | tail -n1 || command -v python3.13 || command -v python3.12)
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
MYSQL_URL ?= mysql://root@127.0.0.1:3306/test
PYTEST_ARGS ?=

.PHONY: venvs test test-quick lint worker bench clean

.venv/.installed: pyproject.toml
	$(PY_DJ52) -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q "Django>=5.2,<5.3" -e ".[test]"
	touch $@

.venv-dj61/.installed: pyproject.toml
	$(PY_DJ61) -m venv .venv-dj61
	.venv-dj61/bin/pip install -q --upgrade pip
	.venv-dj61/bin/pip install -q "Django>=6.1,<6.2" -e ".[test]"
	touch $@

venvs: .venv/.installed .venv-dj61/.installed

lint: .venv/.installed
	.venv/bin/ruff check .
	cd example_project && ../.venv/bin/python manage.py makemigrations --check --dry-run
	cd example_project && ../.venv-dj61/bin/python manage.py makemigrations --check --dry-run

# The whole matrix: every database on both Django lines. A database that is
# unreachable fails the run; nothing is skipped for lack of one.
test: venvs lint
	.venv/bin/python scripts/check_databases.py "$(PG_URL)" "$(MYSQL_URL)"
	for venv in .venv .venv-dj61; do \
	  for url in sqlite "$(PG_URL)" "$(MYSQL_URL)"; do \
	    echo "=== $$venv $$url"; \
	    if [ "$$url" = sqlite ]; then u=; else u=$$url; fi; \
	    DATABASE_URL=$$u $$venv/bin/pytest $(PYTEST_ARGS) || exit 1; \
	  done; \
	done

# SQLite on Django 5.2 only: the fast loop while developing.
test-quick: .venv/.installed
	.venv/bin/pytest $(PYTEST_ARGS)

# The example project: create invoices (their e-mails enqueued in the same
# transactions), then run workers until Ctrl+C. DATABASE_URL picks the database.
worker: .venv/.installed
	cd example_project && ../.venv/bin/python manage.py migrate -v0 \
	  && ../.venv/bin/python manage.py create_invoices \
	  && ../.venv/bin/python manage.py create_devices \
	  && ../.venv/bin/python manage.py runworkers --processes 2 --threads 4

clean:
	rm -rf .venv .venv-dj61 tests/*.sqlite3 example_project/*.sqlite3
