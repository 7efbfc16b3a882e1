"""A reference's init inputs from its syntax tree (cudal1.tasks.static_inputs): equal to running it on the
built-in tasks, and nothing of the reference ever runs."""

from __future__ import annotations

import json

import pytest

from cudal1.eval.compile import json_init_inputs
from cudal1.tasks.sources import load_tasks
from cudal1.tasks.static_inputs import static_init_inputs
from cudal1.tasks.task import Task


def test_agrees_with_running_every_builtin_reference():
    tasks = list(load_tasks("builtin"))
    assert len(tasks) > 20
    for task in tasks:
        ran = json.loads(json.dumps(list(task.load().get_init_inputs())))
        assert json.loads(json.dumps(static_init_inputs(task.source))) == ran, task.id


def test_reads_constants_arithmetic_and_literals():
    source = ('import torch\nbatch = 16\nfeatures = 512 * 8\nhalf = features // 2\nscale = -0.5\n'
              'def get_init_inputs():\n    """doc"""\n    return [features, half, scale, "relu", (3, 3)]\n')
    assert static_init_inputs(source) == [4096, 2048, -0.5, "relu", (3, 3)]


@pytest.mark.parametrize("source", [
    "import os\ndef get_init_inputs():\n    return [os.cpu_count()]\n",  # a call
    "n = 4\nn = len('abc')\ndef get_init_inputs():\n    return [n]\n",  # rebound to something unknown
    "n = 4\nfor n in range(3):\n    pass\ndef get_init_inputs():\n    return [n]\n",  # rebound by a loop
    "n = 4\ndef grow():\n    global n\n    n = 8\ndef get_init_inputs():\n    return [n]\n",  # rebound at run time
    "a = 10**18\nb = a * a\nc = b * b\ndef get_init_inputs():\n    return [c]\n",  # a bignum chain
    "def get_init_inputs():\n    x = 3\n    return [x]\n",  # more than a return
    "x = 1\n",  # no function
    "def get_init_inputs(:\n",  # not Python
])
def test_anything_that_needs_running_is_none(source):
    assert static_init_inputs(source) is None


def test_the_trusted_side_never_runs_a_reference(tmp_path):
    """A reference from a client: reading its init inputs for the compile pool executes none of it."""
    marker = tmp_path / "ran"
    source = (f"open({str(marker)!r}, 'w').close()\nimport torch.nn as nn\nclass Model(nn.Module):\n    pass\n"
              "N = 8\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return [N]\n")
    assert json_init_inputs(Task(id="request/x", source=source, origin="request")) == [8]
    assert not marker.exists()
