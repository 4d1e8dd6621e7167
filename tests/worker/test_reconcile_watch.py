"""The clocks of an attempt (worker.reconcile_watch), without a cluster or a database."""

from __future__ import annotations

from worker import reconcile_watch as watch
from worker.launchers.base import LaunchState, LaunchStatus

PENDING = LaunchStatus(LaunchState.PENDING)
STARTING = LaunchStatus(LaunchState.STARTING, message="1 of 2 pods created", ranks_total=2)
RUNNING = LaunchStatus(LaunchState.RUNNING, ranks_running=2, ranks_total=2)
LIMITS = {"hang_s": 1800.0, "start_s": 600.0, "admission_s": 0.0}


def test_time_suspended_is_never_a_hang():
    state: dict = {}
    assert watch.overdue(state, RUNNING, 0.0, 5, **LIMITS) is None
    assert watch.overdue(state, PENDING, 100.0, 5, **LIMITS) is None  # preempted
    assert watch.overdue(state, PENDING, 2500.0, 5, **LIMITS) is None  # 40 minutes
    assert watch.overdue(state, STARTING, 2510.0, 5, **LIMITS) is None  # re-admitted
    assert watch.overdue(state, RUNNING, 2600.0, 5, **LIMITS) is None
    late = watch.overdue(state, RUNNING, 2510.0 + 1801.0, 5, **LIMITS)
    assert late is not None and late[0] == "hang"  # counted from the re-admission only


def test_a_start_that_never_comes_is_named_and_a_rank_ending_early_is_not():
    state: dict = {}
    assert watch.overdue(state, STARTING, 0.0, None, **LIMITS) is None
    reason, message = watch.overdue(state, STARTING, 601.0, None, **LIMITS)
    assert reason == "not_started" and "1 of 2 pods created" in message
    ran: dict = {}
    assert watch.overdue(ran, RUNNING, 0.0, 1, **LIMITS) is None
    assert watch.overdue(ran, STARTING, 700.0, 2, **LIMITS) is None  # node 1 done first


def test_an_admission_timeout_counts_the_wait_only():
    state: dict = {}
    limits = {**LIMITS, "admission_s": 3600.0}
    assert watch.overdue(state, PENDING, 0.0, None, **limits) is None
    assert watch.overdue(state, PENDING, 3600.0, None, **limits) is None
    assert watch.overdue(state, PENDING, 3601.0, None, **limits)[0] == "admission_timeout"


def test_failed_submits_back_off_doubling_to_a_cap():
    state: dict = {}
    assert watch.submit_due(state, 0.0)
    delays = []
    for now in (0.0, 100.0, 1000.0, 5000.0, 9000.0, 20000.0):
        assert watch.submit_failed(state, now, 15.0) == now
        delays.append(state["submit_at"] - now)
    assert delays == [15.0, 30.0, 60.0, 120.0, 240.0, 480.0]
    watch.submit_failed(state, 30000.0, 15.0)
    assert state["submit_at"] - 30000.0 == watch.MAX_SUBMIT_DELAY
    assert not watch.submit_due(state, 30000.0)
    watch.submitted(state)
    assert state == {} and watch.submit_due(state, 0.0)
