"""What runners say of their GPU memory: a result's record of it, and out-of-memory messages that keep the
numbers (PyTorch puts them on lines that a one-line summary used to cut off)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cudal1.eval.inside.harness import CallFailed, ModelSide, gpu_memory, oom_message
from cudal1.eval.session import Session, SessionFacts

TORCH_OOM = ("CUDA out of memory. Tried to allocate 1.79 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
             "4.04 GiB is free.\nIncluding non-PyTorch memory, this process has 62.58 GiB memory in use. Of the "
             "allocated memory 55.10 GiB is allocated by PyTorch, and 6.45 GiB is reserved but unallocated.")


def test_oom_message_keeps_the_request_size_in_one_line():
    text = oom_message(torch.cuda.OutOfMemoryError(TORCH_OOM), torch.device("cpu"))
    assert text == "out of GPU memory (tried to allocate 1.79 GiB)"


def test_oom_message_without_a_size_keeps_the_first_line():
    text = oom_message(RuntimeError("CUDA error: out of memory\nmore"), torch.device("cpu"))
    assert text.startswith("out of GPU memory (RuntimeError: CUDA error: out of memory")
    assert "more" not in text


def test_a_model_out_of_gpu_memory_is_reported_as_oom_with_its_request():
    class Hog(torch.nn.Module):
        def forward(self, x):
            raise torch.cuda.OutOfMemoryError(TORCH_OOM)

    side = ModelSide(torch.device("cpu"), reference_module=None, model=Hog())
    for call, inputs in ((side.untimed, [torch.ones(2)]), (side._timed, [[torch.ones(2)]])):
        try:
            call(inputs)
        except CallFailed as exc:
            assert exc.kind == "oom" and "tried to allocate 1.79 GiB" in exc.message, exc.message
        else:
            raise AssertionError("the call did not fail")


def test_cpu_has_no_gpu_memory_report():
    assert gpu_memory(torch.device("cpu")) is None


@pytest.mark.gpu
def test_gpu_memory_report_agrees_with_torch_s_own_figures():
    device = torch.device("cuda", torch.cuda.current_device())
    held = torch.empty(3 << 20, dtype=torch.float32, device=device)
    assert gpu_memory(device) == {"allocated": torch.cuda.memory_allocated(device),
                                  "reserved": torch.cuda.memory_reserved(device),
                                  "peak_allocated": torch.cuda.max_memory_allocated(device),
                                  "peak_reserved": torch.cuda.max_memory_reserved(device)}
    assert gpu_memory(device)["allocated"] >= held.numel() * 4


def test_session_records_each_roles_last_report_in_gib():
    facts = SessionFacts()
    holder = SimpleNamespace(facts=facts)
    Session.note_memory(holder, "candidate", {"allocated": 2**30, "peak_reserved": 3 * 2**29})
    Session.note_memory(holder, "reference", None)  # nothing reported: nothing recorded
    Session.note_memory(holder, "candidate", {"allocated": 2**31, "bogus": "x"})
    assert facts.gpu_memory_gib == {"candidate": {"allocated": 2.0}}
    Session.note_memory(holder, "candidate", {"allocated": 2**30, "peak_reserved": 3 * 2**29})
    assert facts.gpu_memory_gib["candidate"] == {"allocated": 1.0, "peak_reserved": 1.5}
    assert facts.recorded() == {"gpu_memory_gib": {"candidate": {"allocated": 1.0, "peak_reserved": 1.5}}}
