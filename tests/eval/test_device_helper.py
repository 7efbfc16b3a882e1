"""`cudal1/eval/device_helper.py` without a GPU: how a bracket that never armed is reported."""

from __future__ import annotations

import pytest

from cudal1.eval.device_helper import AnsweredEarly, DeviceHelper
from cudal1.eval.outcomes import InfraFailure
from cudal1.eval.runner_process import RunnerFailed
from cudal1.eval.shared.protocol import Bracket, ErrorReply


class _Runner:
    def __init__(self, failure: Exception):
        self.failure, self.replies_read = failure, 0

    def send(self, request):
        raise self.failure

    def reply(self, request, timeout_s):
        self.replies_read += 1
        return ErrorReply(kind="internal", message="its own reason")


def _helper(failure: Exception) -> DeviceHelper:
    helper = DeviceHelper.__new__(DeviceHelper)  # no process: only arm()'s reporting is under test
    helper.runner, helper._seq, helper._armed = _Runner(failure), 0, None
    return helper


def test_an_early_answer_is_known_by_its_type_not_its_text():
    """The helper's reply is read when it answered before arming (`AnsweredEarly`), and only then. The parent
    once looked for "answered" in the failure's text: a failed runner whose reason said "answered" had a
    reply read from a dead channel."""
    early = _helper(AnsweredEarly("the device helper answered before it armed"))
    with pytest.raises(InfraFailure, match="did not arm: its own reason"):
        early.arm(_bracket(), 1.0)
    assert early.runner.replies_read == 1

    worded = _helper(RunnerFailed("the runner answered on a closed socket"))
    with pytest.raises(InfraFailure, match="did not arm: the runner answered on a closed socket"):
        worded.arm(_bracket(), 1.0)
    assert worded.runner.replies_read == 0


def _bracket() -> Bracket:
    return Bracket(sid="s", seq=0, who="cand", slot=0, tree={}, flush=False, snapshot_bytes=0)
