"""Stage configs: validation of impossible combinations, YAML + overrides, shipped reference YAMLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal1.core.errors import ConfigError
from cudal1.train.config import (
    STAGES,
    RLStageConfig,
    SelfSupervisedConfig,
    SFTStageConfig,
    load_config,
    parse_overrides,
    reference_yaml,
    write_resolved_config,
)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "src" / "cudal1" / "configs"
BASE = {"model": "scratch", "output_dir": "/tmp/x"}


def test_required_inputs_are_named():
    with pytest.raises(ConfigError, match="set model"):
        RLStageConfig(output_dir="/tmp/x")
    with pytest.raises(ConfigError, match="set dataset"):
        SFTStageConfig(**BASE)


@pytest.mark.parametrize("bad, match", [
    ({"num_generations": 3, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}, "multiple of"),
    ({"num_generations": 1}, ">= 2"),
    ({"use_lora": True, "lora_r": 0}, "lora_r"),
    ({"reward_clip_k": 0.0}, "reward_clip_k"),
    ({"failure_rewards": {"exploded": -1.0}}, "unknown statuses"),
    ({"report_to": "mlflow"}, "report_to"),
    ({"split": "validation"}, "split"),
    ({"temperature": 0.0}, "temperature must be > 0"),
    ({"top_p": 1.5}, "top_p"),
    ({"workers": "gpu-farm"}, "workers must be empty, local"),
    ({"eval_policy": "kernelbenhc"}, "unknown policy"),
])
def test_impossible_rl_configs_raise_with_the_setting_to_change(bad, match):
    with pytest.raises(ConfigError, match=match):
        RLStageConfig(**BASE, **bad)


def test_rl_defaults_follow_the_paper():
    cfg = RLStageConfig(**BASE)
    assert cfg.reward_clip_k == 1.5 and cfg.exemplars_per_prompt == 2 and cfg.exemplar_sampler == "bucket"
    assert set(cfg.failure_rewards.values()) == {0.0} and "incorrect" in cfg.failure_rewards
    assert cfg.resolved_generation_batch_size % cfg.num_generations == 0


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "rl.yaml"
    path.write_text("model: scratch\noutput_dir: out\nlearning_rate: 1.0e-4\nnum_generations: 4\n"
                    "failure_rewards: {incorrect: -0.5}\n")
    cfg = load_config(RLStageConfig, path, ["learning_rate=3e-5", "use_lora=true", "lora_target_modules=q_proj,v_proj"])
    assert cfg.learning_rate == 3e-5 and cfg.use_lora is True and cfg.num_generations == 4
    assert cfg.lora_target_modules == ["q_proj", "v_proj"]
    assert cfg.failure_rewards["incorrect"] == -0.5 and cfg.failure_rewards["timeout"] == 0.0


def test_unknown_and_mistyped_settings_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown RLStageConfig settings: lr"):
        load_config(RLStageConfig, None, {**BASE, "lr": 1})
    with pytest.raises(ConfigError, match="num_generations must be int"):
        load_config(RLStageConfig, None, {**BASE, "num_generations": "eight"})
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_overrides(["novalue"])


def test_resolved_config_is_written(tmp_path):
    cfg = SelfSupervisedConfig(**{**BASE, "output_dir": str(tmp_path)})
    path = write_resolved_config(cfg, tmp_path)
    text = path.read_text()
    assert "stage: SelfSupervisedConfig" in text and "samples_per_task: 8" in text


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_shipped_reference_yaml_is_current(stage):
    """The YAML in cudal1/configs is generated from the dataclass; regenerate with scripts or reference_yaml."""
    cls = STAGES[stage]
    assert (CONFIG_DIR / f"{stage}.yaml").read_text() == reference_yaml(cls)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_reference_yaml_loads_back(stage, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(reference_yaml(STAGES[stage]))
    cfg = load_config(STAGES[stage], path, {**BASE, "dataset": "d.jsonl"} if stage == "sft" else BASE)
    assert cfg.model == "scratch"


def test_stage2_may_decode_greedily_but_not_with_an_empty_nucleus(tmp_path):
    assert SelfSupervisedConfig(**{**BASE, "output_dir": str(tmp_path), "temperature": 0.0}).temperature == 0.0
    with pytest.raises(ConfigError, match="top_p"):
        SelfSupervisedConfig(**{**BASE, "output_dir": str(tmp_path), "top_p": 0.0})


def test_island_settings_reach_the_sampler():
    from cudal1.exemplars import make_sampler
    from cudal1.train.rl import sampler_config

    cfg = RLStageConfig(**BASE, exemplar_sampler="island", islands=7, island_migrate_every=3, island_reset_every=9,
                        sampler_temperature=0.5)
    sampler = make_sampler("island", sampler_config(cfg))
    assert (sampler.config.num_islands, sampler.config.migrate_every, sampler.config.reset_every,
            sampler.config.temperature) == (7, 3, 9, 0.5)
    with pytest.raises(ConfigError, match="islands must be >= 1"):
        RLStageConfig(**BASE, islands=0)


def test_sft_data_and_rl_prompts_ask_for_the_same_form_by_default():
    """augment asked for raw CUDA while training prompted for load_inline unless the user set the form."""
    import dataclasses

    from cudal1.loops.augment import AugmentConfig
    from cudal1.loops.optimize import OptimizeConfig
    from cudal1.train.policy_eval import PolicyEvalConfig

    defaults = {f.name: f.default for f in dataclasses.fields(RLStageConfig)}
    assert defaults["form"] == "auto"  # each resolves auto alike (llm.prompts.resolve_form)
    assert {f.default for cls in (AugmentConfig, OptimizeConfig, PolicyEvalConfig)
            for f in dataclasses.fields(cls) if f.name == "form"} == {"auto"}


def test_form_auto_becomes_the_form_that_runs_where_rewards_are_evaluated(tmp_path):
    """on the CPU the stages asked for raw CUDA, which cannot run there."""
    cpu = RLStageConfig(model="scratch", output_dir=str(tmp_path), eval_device="cpu")
    remote = RLStageConfig(model="scratch", output_dir=str(tmp_path), eval_device="cpu",
                           workers="http://127.0.0.1:8765")
    assert cpu.form == "torch" and remote.form == "raw_cuda"
    assert RLStageConfig(model="scratch", output_dir=str(tmp_path), form="load_inline").form == "load_inline"


def test_a_hub_policy_is_not_copied_for_the_reference_model(tmp_path):
    """With beta > 0 a hub model was saved whole into the run folder (about 15 GB for a 7B model) although
    TRL reloads the reference policy from the hub itself."""
    from types import SimpleNamespace

    from cudal1.train.rl import _reference_path

    cfg = RLStageConfig(**{**BASE, "model": "some-org/some-model", "output_dir": str(tmp_path), "beta": 0.04})
    hub = SimpleNamespace(config=SimpleNamespace(_name_or_path="some-org/some-model"))
    _reference_path(hub, cfg, tokenizer=None)
    assert hub.config._name_or_path == "some-org/some-model" and not (tmp_path / "reference_policy").exists()


def test_vllm_generation_is_chosen_where_it_can_run():
    from cudal1.train import rl as rl_module

    cfg = load_config(RLStageConfig, None, {"model": "scratch", "output_dir": "/tmp/x", "use_cpu": True})
    assert cfg.vllm == "auto" and rl_module.vllm_args(cfg) == {"use_vllm": False}  # no GPU: transformers path
    plain = load_config(RLStageConfig, None, {"model": "scratch", "output_dir": "/tmp/x", "vllm": "transformers"})
    assert rl_module.vllm_args(plain) == {"use_vllm": False}
    with pytest.raises(ConfigError, match="vllm must be one of"):
        load_config(RLStageConfig, None, {"model": "scratch", "output_dir": "/tmp/x", "vllm": "gpu"})


def test_an_explicit_vllm_mode_maps_to_trl_and_needs_vllm(monkeypatch):
    from cudal1.train import rl as rl_module

    server = load_config(RLStageConfig, None, {"model": "scratch", "output_dir": "/tmp/x", "vllm": "server",
                                               "vllm_server_url": "http://10.0.0.5:8000"})
    monkeypatch.setattr(rl_module, "vllm_available", lambda: False)
    with pytest.raises(ConfigError, match="needs vLLM installed"):
        rl_module.vllm_args(server)
    monkeypatch.setattr(rl_module, "vllm_available", lambda: True)
    assert rl_module.vllm_args(server) == {"use_vllm": True, "vllm_mode": "server",
                                           "vllm_server_base_url": "http://10.0.0.5:8000"}
    colocate = load_config(RLStageConfig, None, {"model": "scratch", "output_dir": "/tmp/x", "vllm": "colocate",
                                                 "vllm_gpu_memory_utilization": 0.4})
    assert rl_module.vllm_args(colocate) == {"use_vllm": True, "vllm_mode": "colocate",
                                             "vllm_gpu_memory_utilization": 0.4}


def test_each_rank_of_a_multi_process_run_times_on_its_own_gpu(monkeypatch):
    from cudal1.train.config import rank_device

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert rank_device("cuda") == "cuda"
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert rank_device("cuda") == "cuda:3" and rank_device("cuda:1") == "cuda:1" and rank_device("cpu") == "cpu"
    assert rank_device("auto") == "auto"  # no GPU here: auto stays the CPU
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine: cuda is a valid setting
    cfg = load_config(RLStageConfig, None, {"model": "scratch", "output_dir": "/tmp/x", "eval_device": "cuda"})
    assert cfg.eval_config().device == "cuda:3"


def test_an_evaluator_gpu_where_there_is_none_is_an_error_before_training(monkeypatch, tmp_path):
    """`--set eval_device=cuda` on a CPU machine trained on, every reward failing later: the stages that evaluate
    check the machine first, before a model is loaded; the fix is named as training spells it (a `fix` the CLI
    writes as --set eval_device=cpu). A recipe for a GPU machine stays a valid config anywhere."""
    import torch

    from cudal1.train.common import check_evaluation_device
    from cudal1.train.rl import run_rl
    from cudal1.train.self_supervised import run_self_supervised

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = RLStageConfig(**{**BASE, "output_dir": str(tmp_path / "rl")}, eval_device="cuda")  # valid as a config
    with pytest.raises(ConfigError, match="no CUDA GPU is visible; use device=cpu") as info:
        check_evaluation_device(cfg)
    assert info.value.fix == ("device", "cpu")
    for run, stage in ((run_rl, cfg), (run_self_supervised, SelfSupervisedConfig(
            **{**BASE, "output_dir": str(tmp_path / "ss")}, eval_device="cuda"))):
        with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
            run(stage)
        assert not Path(stage.output_dir).exists()  # refused before anything was written or loaded
    check_evaluation_device(RLStageConfig(**BASE, eval_device="cuda", workers="http://127.0.0.1:9"))  # elsewhere


def test_log_completions_is_a_setting_of_stages_2_and_3(tmp_path):
    """`--set log_completions=true` was "unknown RLStageConfig settings"."""
    for cls in (RLStageConfig, SelfSupervisedConfig):
        config = load_config(cls, None, ["log_completions=false", "model=scratch", f"output_dir={tmp_path}"])
        assert config.log_completions is False
        assert load_config(cls, None, {"model": "scratch", "output_dir": str(tmp_path)}).log_completions


def test_a_renamed_setting_is_read_under_its_new_name_with_a_warning(tmp_path):
    """`eval_workers` (the old name of `eval_threads`) in a YAML file still works, once, with a FutureWarning;
    both names at once are an error naming the one to keep."""
    path = tmp_path / "rl.yaml"
    path.write_text("model: scratch\noutput_dir: /tmp/x\neval_workers: 3\n")
    with pytest.warns(FutureWarning, match="eval_threads"):
        cfg = load_config(RLStageConfig, path)
    assert cfg.eval_threads == 3
    with pytest.raises(ConfigError, match="give only eval_threads"):
        load_config(RLStageConfig, path, ["eval_threads=2"])


def _stage_values(cls, tmp_path) -> dict:
    extra = {"dataset": str(tmp_path / "d.jsonl")} if cls is SFTStageConfig else {}
    return {**BASE, "output_dir": str(tmp_path / "run"), **extra}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_float_setting_must_be_finite_and_every_range_is_enforced(stage, tmp_path):
    """`--set learning_rate=nan` reached the optimizer ("Invalid learning rate: nan", a bug to the CLI): NaN
    passes every `x <= 0` check. Each float refuses nan and inf by name, each declared range the value just
    outside it, through the same path as `--set`."""
    import dataclasses
    import typing

    from cudal1.core.ranges import in_range

    cls = STAGES[stage]
    base = _stage_values(cls, tmp_path)
    hints = typing.get_type_hints(cls)
    floats = [f.name for f in dataclasses.fields(cls) if hints[f.name] is float]
    assert "learning_rate" in floats and len(floats) >= 8
    for name in floats:
        for raw in ("nan", "inf", "-inf", ".nan"):
            with pytest.raises(ConfigError, match=f"^{name} must be a finite number"):
                load_config(cls, None, {**base, **parse_overrides([f"{name}={raw}"])})
    ranges = cls(**base).ranges()
    assert {"learning_rate", "seed", "warmup_ratio", "eval_timeout_s"} <= set(ranges)
    for name, spec in ranges.items():
        numbers = [float(n) for n in spec.strip("[]()<>= ").replace(",", " ").split()]
        outside = [v for n in numbers for v in (n - 1, n - 1e-3, n, n + 1e-3, n + 1) if not in_range(v, spec)]
        assert outside, (name, spec)
        kind = hints[name]
        value = kind(outside[0]) if kind is float else int(outside[0]) if not in_range(int(outside[0]), spec) \
            else int(outside[-1])
        with pytest.raises(ConfigError, match=f"^{name} must be"):
            cls(**{**base, name: value})


def test_an_output_dir_that_is_a_file_and_an_empty_config_are_named(tmp_path):
    """`train -o FILE` said `[Errno 17] File exists`; an empty YAML trained on the defaults without a word."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=f"output_dir {afile} is a file, not a folder"):
        RLStageConfig(**{**BASE, "output_dir": str(afile)})
    for text in ("", "# only comments\n", "---\n"):
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        with pytest.raises(ConfigError, match="is empty \\(no settings\\)"):
            load_config(RLStageConfig, empty, BASE)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping of settings, not a list"):
        load_config(RLStageConfig, listing, BASE)
    with pytest.raises(ConfigError, match="failure_rewards must map statuses to finite numbers"):
        RLStageConfig(**BASE, failure_rewards={"compile_error": float("nan")})
