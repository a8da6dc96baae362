"""The libraries' tests need their apps installed: ``--ds tests.settings_libraries``.

Under any other settings (the main suite, ``pytest`` alone) this directory is
not collected; ``make test`` runs it on its own (see the Makefile).
"""

from django.conf import settings

if settings.SETTINGS_MODULE != "tests.settings_libraries":
    collect_ignore_glob = ["*"]
