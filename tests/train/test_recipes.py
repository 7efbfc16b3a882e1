"""The 7B recipes and the multi-GPU launch configs, checked on a CPU with tiny models: every field is a real
setting, TRL accepts the arguments they make, the accelerate files parse, and a two-process data-parallel
stage 3 trains, saves its policy once and writes its records once (rank 0)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cudal1.core.errors import ConfigError
from cudal1.train.config import RLStageConfig, SelfSupervisedConfig, SFTStageConfig, load_config
from cudal1.train.rl import grpo_args
from tests.train.helpers import FIXTURE_TASKS

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes"


@pytest.mark.parametrize(("name", "cls"), [("sft_7b_lora.yaml", SFTStageConfig),
                                            ("rl_7b_lora_1gpu.yaml", RLStageConfig),
                                            ("rl_7b_lora_8gpu.yaml", RLStageConfig)])
def test_every_recipe_field_is_a_setting(name, cls, tmp_path):
    config = load_config(cls, RECIPES / name, {"output_dir": str(tmp_path), **({"dataset": "sft.jsonl"} if cls is SFTStageConfig else {})})
    assert config.model == "Qwen/Qwen2.5-Coder-7B-Instruct" and config.use_lora and config.bf16
    assert config.form == "raw_cuda"


@pytest.mark.parametrize("name", ["rl_7b_lora_1gpu.yaml", "rl_7b_lora_8gpu.yaml"])
def test_trl_accepts_the_rl_recipes(name, tmp_path):
    # On this CPU: vLLM is not installed (an explicit colocate is a clear error), bf16 is left to the GPU.
    config = load_config(RLStageConfig, RECIPES / name, {"output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="needs vLLM"):
        grpo_args(config)
    cpu = load_config(RLStageConfig, RECIPES / name, {"output_dir": str(tmp_path), "vllm": "transformers",
                                                      "use_cpu": True, "bf16": False, "report_to": "none"})
    args = grpo_args(cpu)
    assert args.num_generations == 8 and args.gradient_checkpointing and not args.use_vllm
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps % args.num_generations == 0


def test_the_accelerate_configs_parse():
    from accelerate.commands.config.config_args import load_config_from_file

    ddp = load_config_from_file(str(RECIPES / "accelerate_ddp.yaml"))
    assert ddp.distributed_type == "MULTI_GPU" and ddp.num_processes == 8 and ddp.mixed_precision == "bf16"
    zero3 = load_config_from_file(str(RECIPES / "accelerate_zero3.yaml"))
    assert zero3.distributed_type == "DEEPSPEED" and zero3.deepspeed_config["zero_stage"] == 3
    assert zero3.deepspeed_config["zero3_save_16bit_model"] is True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_data_parallel_stage3_saves_once(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           "-m", "cudal1", "train", "rl", "--model", "scratch", "-o", str(out), "--source", str(FIXTURE_TASKS),
           "--split", "all"]
    for setting in ("use_cpu=true", "report_to=none", "store=none", "eval_device=cpu", "max_steps=2",
                    "num_generations=2", "per_device_train_batch_size=2", "gradient_accumulation_steps=1",
                    "max_completion_length=16", "save_steps=1000", "eval_threads=1", "max_tasks=2", "beta=0.01"):
        cmd += ["--set", setting]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2
    assert (out / "final" / "model.safetensors").is_file() and (out / "reference_policy").is_dir()
    assert done.stdout.count("rl finished") == 2  # both ranks trained; one wrote (no race on the files)


def test_stage2_refuses_a_multi_process_launch(tmp_path, monkeypatch):
    from cudal1.train.self_supervised import run_self_supervised

    monkeypatch.setenv("WORLD_SIZE", "2")
    config = load_config(SelfSupervisedConfig, None, {"model": "scratch", "output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="one process"):
        run_self_supervised(config)
