"""The benchmark harness: databases, virtualenvs, worker processes, measurements."""
