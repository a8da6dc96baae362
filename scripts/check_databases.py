"""Fail loudly when a database the test matrix needs cannot be reached."""

import sys

import MySQLdb
import psycopg
from environ import Env


def main(pg_url: str, mysql_url: str) -> int:
    failures = []
    pg = Env.db_url_config(pg_url)
    try:
        psycopg.connect(
            host=pg["HOST"],
            port=pg["PORT"] or 5432,
            user=pg["USER"],
            password=pg["PASSWORD"],
            dbname=pg["NAME"],
            connect_timeout=5,
        ).close()
    except Exception as exc:
        failures.append(f"PostgreSQL at {pg_url}: {exc}")
    my = Env.db_url_config(mysql_url)
    try:
        MySQLdb.connect(
            host=my["HOST"],
            port=int(my["PORT"] or 3306),
            user=my["USER"],
            password=my["PASSWORD"],
            database=my["NAME"],
            connect_timeout=5,
        ).close()
    except Exception as exc:
        failures.append(f"MySQL/MariaDB at {mysql_url}: {exc}")
    for failure in failures:
        print(f"unreachable: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
