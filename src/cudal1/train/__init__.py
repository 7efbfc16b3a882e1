"""The training pipeline: stage 1 SFT, stage 2 self-supervised rounds, stage 3 contrastive GRPO (TRL),
task splits and policy evaluation.

Everything here imports TRL/transformers/datasets lazily, so `import cudal1.train` is cheap; a missing
optional dependency raises `MissingDependencyError` naming the `train` extra when a stage starts.
Tested with TRL 1.16, transformers 5.24, peft 0.21, datasets 5.2 (the `train` extra requires peft 0.21 or later).

    from cudal1.train import SFTStageConfig, run_sft
    result = run_sft(SFTStageConfig(model="scratch", output_dir="runs/sft", dataset="sft.jsonl"))
"""

from cudal1.core.lazy import lazy_exports
from cudal1.tasks.splits import TaskSplit, load_or_make_split, make_split, select_tasks
from cudal1.train.config import (
    STAGES,
    CommonTrainConfig,
    RLStageConfig,
    SelfSupervisedConfig,
    SFTStageConfig,
    load_config,
    reference_yaml,
)

#: Loaded on first use: the stage modules pull in heavier imports.
_LAZY = {"run_sft": "cudal1.train.sft", "run_self_supervised": "cudal1.train.self_supervised",
         "run_rl": "cudal1.train.rl", "evaluate_policy": "cudal1.train.policy_eval",
         "PolicyEvalConfig": "cudal1.train.policy_eval", "KernelReward": "cudal1.train.rewards",
         "RewardConfig": "cudal1.train.rewards", "smooth_rewards": "cudal1.core.rewards",
         "StageResult": "cudal1.train.common"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = ["STAGES", "CommonTrainConfig", "SFTStageConfig", "SelfSupervisedConfig", "RLStageConfig", "load_config",
           "reference_yaml", "TaskSplit", "make_split", "load_or_make_split", "select_tasks", *_LAZY]
