"""`cudal1 train ...` and `cudal1 evaluate-policy` in-process: help, printed configs, errors, a tiny run.

(These test `cudal1/cli/train_cmd.py` and `cudal1/cli/policy_cmd.py`; they live with the training tests.)
"""

from __future__ import annotations

import json

import pytest

from cudal1.cli.main import main
from tests.train.helpers import FIXTURE_TASKS, correct_code, write_jsonl


@pytest.mark.parametrize("argv", [["train", "--help"], ["train", "sft", "--help"],
                                  ["train", "self-supervised", "--help"], ["train", "rl", "--help"],
                                  ["evaluate-policy", "--help"]])
def test_help(argv, capsys):
    assert main(argv) == 0
    assert "Usage" in capsys.readouterr().out


def test_print_config_is_the_reference_yaml(capsys):
    assert main(["train", "rl", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "reward_clip_k: 1.5" in out and "num_generations: 8" in out


@pytest.mark.parametrize("stage", ["sft", "self-supervised", "rl"])
def test_a_printed_config_loads_back(stage, tmp_path, capsys):
    """`train STAGE --print-config > f.yaml` then `--config f.yaml`: long comments used to wrap into bad YAML."""
    from cudal1.train.config import STAGES, load_config

    assert main(["train", stage, "--print-config"]) == 0
    path = tmp_path / "stage.yaml"
    path.write_text(capsys.readouterr().out)
    required = {"model": "scratch", "output_dir": str(tmp_path / "o"), **({"dataset": "d.jsonl"} if stage == "sft" else {})}
    assert load_config(STAGES[stage.replace("-", "_")], path, required) is not None


def test_impossible_config_is_one_line_error(capsys):
    code = main(["train", "rl", "--model", "scratch", "-o", "/tmp/never", "--set", "use_lora=true",
                 "--set", "lora_r=0"])
    assert code == 2
    assert "lora_r" in capsys.readouterr().err


def test_tiny_sft_run_through_the_cli(tmp_path, tiny_tasks, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "speed up", "completion": correct_code(t)}
                                               for t in tiny_tasks])
    out_dir = tmp_path / "run"
    code = main(["train", "sft", "--model", "scratch", "-o", str(out_dir), "--dataset", str(data),
                 "--source", str(FIXTURE_TASKS), "--set", "max_steps=1", "--set", "use_cpu=true",
                 "--set", "report_to=none", "--set", "store=none", "--set", "max_length=512"])
    assert code == 0, capsys.readouterr()
    assert json.loads((out_dir / "summary.json").read_text())["steps"] == 1
    assert (out_dir / "final" / "config.json").is_file()


def test_a_max_length_that_truncation_empties_is_one_line(tmp_path, tiny_tasks, capsys):
    """a 142-line traceback ("num_samples=0") when truncation dropped every record."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "speed this module up " * 20,
                                               "completion": correct_code(t)} for t in tiny_tasks])
    code = main(["train", "sft", "--model", "scratch", "-o", str(tmp_path / "run"), "--dataset", str(data),
                 "--split", "all", "--set", "max_length=64", "--set", "max_steps=1", "--set",
                 "report_to=none", "--set", "store=none"])
    captured = capsys.readouterr()
    assert code == 2 and len(captured.err.strip().splitlines()) == 1, captured.err
    assert "max_length=64 leaves no answer token" in captured.err and "--set max_length=" in captured.err


def test_no_records_in_the_split_says_why(tmp_path, capsys):
    """"no SFT records in split 'train'" did not say that the task ids were not in --source."""
    ref = next(FIXTURE_TASKS.rglob("*.py")).read_text()
    row = {"task_id": "jsonl/level1/7", "ref_code": ref, "code": "x = 1"}
    data = write_jsonl(tmp_path / "d.jsonl", [row])
    code = main(["train", "sft", "--model", "scratch", "-o", str(tmp_path / "run"), "--dataset", str(data),
                 "--source", str(FIXTURE_TASKS), "--set", "report_to=none", "--set", "store=none"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "not in --source" in err and "'jsonl/level1/7'" in err and "--split all" in err
