"""A module that is there but cannot be imported: it needs a package nobody installed."""

import rdbtasks_test_no_such_dependency  # noqa: F401
