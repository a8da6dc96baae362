"""What a worker process's exit status says about how it ended."""

import signal

from django_rdbtasks.worker.exits import (
    EXIT_AT_ONCE,
    EXIT_RECYCLE,
    EXIT_TIMED_OUT,
    RECYCLED,
    exit_reason,
)


def test_each_way_of_ending_has_its_own_words():
    assert exit_reason(0) == "stopped"
    assert exit_reason(EXIT_RECYCLE) == "recycled after --max-tasks"
    assert exit_reason(EXIT_TIMED_OUT) == "recycled: a task ran past its timeout and did not stop"
    assert exit_reason(EXIT_AT_ONCE) == "exited at once on a second signal"
    assert exit_reason(-signal.SIGKILL) == "killed by SIGKILL"
    assert exit_reason(-200) == "killed by signal 200"
    assert exit_reason(1) == "exited with 1"


def test_only_recycling_is_followed_by_a_new_process_at_once():
    assert RECYCLED == {EXIT_RECYCLE, EXIT_TIMED_OUT}
    assert len({0, 1, 2, EXIT_RECYCLE, EXIT_TIMED_OUT, EXIT_AT_ONCE}) == 6  # none shared
