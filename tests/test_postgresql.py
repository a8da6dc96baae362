"""PostgreSQL's statements' parameters, without a database."""

import uuid

from django_rdbtasks.db.postgresql import _parameter


def test_ids_and_versions_go_as_one_parameter():
    ids = ["01a2184c-11bf-7001-846e-3f4057f98e62", "01a2184c-11bf-7037-8562-b0a359079e31"]
    assert _parameter(ids) == "{" + ",".join(ids) + "}"
    assert _parameter([uuid.UUID(ids[0])]) == "{" + ids[0] + "}"
    assert _parameter([3, 12, 7]) == "{3,12,7}"
    assert _parameter([]) == "{}"


def test_anything_that_would_need_quoting_is_left_to_the_driver():
    for values in (["concurrency:k1"], ["a b"], ['"'], ["x}"], [""], ["1", ""]):
        assert _parameter(values) is values
    assert _parameter("text") == "text" and _parameter(7) == 7
