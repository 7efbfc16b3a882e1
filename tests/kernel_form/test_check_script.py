"""`scripts/kernel_form_check.py`: its arguments, and on a machine without a GPU a clear refusal."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.scripts import load_script


def test_arguments_parse_and_bad_sizes_are_refused(capsys):
    check = load_script("kernel_form_check")
    args = check.parse_args(["out", "--sizes", "1024,4096", "--reps", "5"])
    assert args.sizes == [1024, 4096] and args.reps == 5 and args.warmup == 10
    with pytest.raises(SystemExit):
        check.parse_args(["out", "--sizes", "a,b"])
    assert "--sizes 'a,b': expected comma-separated integers" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    check = load_script("kernel_form_check")
    assert check.main([str(tmp_path / "out")]) == 2
    assert "kernel_form_check: needs a GPU" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
