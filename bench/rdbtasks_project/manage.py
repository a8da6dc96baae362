#!/usr/bin/env python
"""manage.py of the benchmark's django-rdbtasks project."""

import os
import sys
from pathlib import Path

# The package is imported from this checkout, installed or not.
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
