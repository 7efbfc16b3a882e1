"""One source of truth for configuration docs: render every component's dataclass config as Markdown.

Each config field carries its help text in `metadata={"help": ...}`; `render_reference()` turns them into
`docs/configuration.md`, and a test fails when that file is out of date
(regenerate: `python -m cudal1.config_docs > docs/configuration.md`).
"""

from __future__ import annotations

import dataclasses
import importlib
import typing

# (section title, "module:Class") in the order a user meets them.
CONFIGS = (
    ("Evaluation", "cudal1.eval.config:EvalConfig"),
    ("Compile service (load_inline builds)", "cudal1.eval.compile:CompileConfig"),
    ("LLM backends", "cudal1.llm.backends:LLMConfig"),
    ("Exemplar sampling: bucket", "cudal1.exemplars.sampling:BucketSamplingConfig"),
    ("Exemplar sampling: island", "cudal1.exemplars.sampling:IslandSamplingConfig"),
    ("Exemplar sampling: random", "cudal1.exemplars.sampling:RandomSamplingConfig"),
    ("cudal1 optimize", "cudal1.loops.optimize:OptimizeConfig"),
    ("cudal1 augment", "cudal1.loops.augment:AugmentConfig"),
    ("Training: common", "cudal1.train.config:CommonTrainConfig"),
    ("Training: SFT stage", "cudal1.train.config:SFTStageConfig"),
    ("Training: self-supervised stage", "cudal1.train.config:SelfSupervisedConfig"),
    ("Training: contrastive RL stage", "cudal1.train.config:RLStageConfig"),
    ("Training: reward", "cudal1.train.rewards:RewardConfig"),
    ("Policy evaluation", "cudal1.train.policy_eval:PolicyEvalConfig"),
    ("Audit", "cudal1.audit.run:AuditConfig"),
    ("Audit of every release: a chunk (cudal1 audit-chunk)", "cudal1.audit.chunks:ChunkConfig"),
    ("Audit of every release: the chunk's cost model", "cudal1.audit.chunks:CostModel"),
    ("Audit of every release: the pages (cudal1 audit-pages, audit-ingest)", "cudal1.audit.pages:PagesConfig"),
    ("LLM judge", "cudal1.judge.judge:JudgeConfig"),
    ("Reward server", "cudal1.service.server_config:ServerConfig"),
    ("Local evaluator pool", "cudal1.service.pool:LocalPoolConfig"),
    ("Ray evaluator pool", "cudal1.service.ray_pool:RayPoolConfig"),
    ("Outlier re-check", "cudal1.service.recheck:RecheckConfig"),
)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type_name(tp: typing.Any) -> str:
    return tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))


def render_config(title: str, cls: type) -> str:
    """A Markdown section: one row per field (name, type, default, help)."""
    own = {f.name for f in dataclasses.fields(cls)}
    inherited = set()
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base):
            inherited |= {f.name for f in dataclasses.fields(base)}
    rows = [f"### {title} (`{cls.__module__}.{cls.__name__}`)", "", "| field | type | default | meaning |",
            "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        if f.name in inherited and cls.__name__ != "CommonTrainConfig" and f.name in own:
            continue  # documented once, in its base class
        help_text = " ".join(str(f.metadata.get("help", "")).split()).replace("|", "\\|")
        kind = _type_name(f.type).replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{kind}` | `{_default(f)}` | {help_text} |")
    return "\n".join(rows)


def render_reference() -> str:
    """The whole configuration reference (docs/configuration.md)."""
    parts = ["# Configuration reference", "",
             "Generated from the dataclass configs by `python -m cudal1.config_docs`; do not edit by hand.",
             "CLI options and YAML files map onto these fields (`--set KEY=VALUE` and `--eval-set KEY=VALUE`",
             "where a command offers them).", ""]
    for title, target in CONFIGS:
        module, name = target.split(":")
        parts += [render_config(title, getattr(importlib.import_module(module), name)), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(render_reference(), end="")
