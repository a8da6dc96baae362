#!/usr/bin/env python
"""manage.py of the throwaway django-tasks-db project (runs in its own virtualenv)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
