"""Options generated from config fields (cli/options.py): their help is the field's help, and every value given
on the command line reaches the config the command builds."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import typer.main
from typer.testing import CliRunner

from cudal1.cli.main import app
from cudal1.cli.options import _scalar, field_help, options_of, parse_sets
from cudal1.core.errors import ConfigError
from cudal1.eval.config import EvalConfig


def _leaves(command=None, path=()):
    command = command or typer.main.get_command(app)
    if not getattr(command, "commands", None):
        yield " ".join(path), command
        return
    for name, sub in command.commands.items():
        yield from _leaves(sub, (*path, name))


COMMANDS = dict(_leaves())
GENERATED = {name: c for name, c in COMMANDS.items() if options_of(c.callback)}


def test_the_commands_that_mirror_configs_generate_their_options():
    assert {"eval", "augment", "optimize", "serve", "train sft", "train self-supervised", "train rl", "audit",
            "baseline", "evaluate-policy"} <= set(GENERATED)


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_a_generated_option_s_help_is_its_field_s_help(name):
    command = GENERATED[name]
    generated = options_of(command.callback)
    outcome = CliRunner().invoke(app, [*name.split(), "--help"], terminal_width=1000, max_content_width=1000)
    assert outcome.exit_code == 0, outcome.output
    shown = " ".join(outcome.output.split())
    for param in command.params:
        if param.name in generated:
            cls, field = generated[param.name]
            assert param.help == field_help(cls, field), (param.opts, cls.__name__, field)
            assert " ".join(field_help(cls, field).split()) in shown, param.opts


# A value unlike the default for each generated field that takes a string; numbers and flags are derived.
STRINGS = {"device": "cpu", "profile": "loose", "sizes": "small", "sandbox": "none", "policy": "kernelbench",
           "estimator": "buckets", "form": "torch", "sampler": "island", "run_name": "walked", "baselines": "none",
           "splits_file": "", "host": "127.0.0.2", "model": "scratch", "output_dir": "out", "source": "builtin",
           "split": "test", "resume_from_checkpoint": "latest", "dataset": "data.jsonl", "exemplar_db": "ex.sqlite",
           "eval_sandbox": "none"}


def _walk(command) -> tuple[list[str], dict[str, tuple[type, str, object]]]:
    """argv giving every generated option of `command` a non-default value, and {param: (class, field, value)}."""
    argv, expected = [], {}
    for param in command.params:
        if param.name not in options_of(command.callback):
            continue
        cls, field = options_of(command.callback)[param.name]
        default, kind = param.default, _scalar(typing.get_type_hints(cls)[field])[0]
        if kind is bool:
            value = not default
            argv.append((param.opts if value else param.secondary_opts)[0])
        elif kind is int:
            value = (default or 1) + 2
            argv += [param.opts[0], str(value)]
        elif kind is float:
            value = (default or 1.0) + 1.5
            argv += [param.opts[0], str(value)]
        else:
            value = STRINGS[field]
            argv += [param.opts[0], value]
        expected[param.name] = (cls, field, value)
    return argv, expected


class Reached(Exception):
    pass


def _check(expected, configs):
    for cls, field, value in expected.values():
        config = next(c for c in configs if isinstance(c, cls))
        assert getattr(config, field) == value, (cls.__name__, field)


def test_every_eval_option_reaches_the_evaluation_config(monkeypatch, tmp_path):
    from cudal1.cli import eval_cmd

    seen = []

    def evaluate(task, source, cfg, **kwargs):
        seen.append(cfg)
        raise Reached

    monkeypatch.setattr(eval_cmd, "evaluate_candidate", evaluate)
    argv, expected = _walk(COMMANDS["eval"])
    candidate = tmp_path / "c.py"
    candidate.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    outcome = CliRunner().invoke(app, ["eval", "-c", str(candidate), "-t", "argmax_middle_dim", "--no-store", *argv,
                                       "--set", "warm_buckets=0", "--set", "memory_bytes=none"])
    assert isinstance(outcome.exception, Reached), outcome.output
    assert len(expected) >= 12
    _check(expected, seen)
    assert seen[0].warm_buckets == 0 and seen[0].memory_bytes is None


@pytest.mark.parametrize("name", ["augment", "optimize"])
def test_every_option_of_the_llm_loops_reaches_their_configs(name, monkeypatch, tmp_path):
    import importlib

    import cudal1.llm

    loops = {n: importlib.import_module(f"cudal1.loops.{n}") for n in ("augment", "optimize")}
    seen = []

    def run(*args, **kwargs):
        config = next(a for a in args if dataclasses.is_dataclass(a) and not hasattr(a, "hash"))
        seen.extend([config, config.eval, getattr(config, "llm", None)])
        raise Reached

    monkeypatch.setattr(loops["augment"], "ready_backends", lambda config: [])
    monkeypatch.setattr(loops["augment"], "augment", run)
    monkeypatch.setattr(cudal1.llm, "make_backend", lambda config: None)
    monkeypatch.setattr(loops["optimize"], "optimize", run)
    argv, expected = _walk(COMMANDS[name])
    head = ["optimize", "argmax_middle_dim", "--llm", "openai:m@http://127.0.0.1:9/v1"] if name == "optimize" else ["augment"]
    outcome = CliRunner().invoke(app, [*head, *argv, "--store", str(tmp_path / "s.sqlite"),
                                       "--eval-set", "warm_buckets=0"])
    assert isinstance(outcome.exception, Reached), outcome.output
    _check(expected, [c for c in seen if c is not None])
    assert seen[1].warm_buckets == 0


@pytest.mark.parametrize("name", ["train sft", "train self-supervised", "train rl"])
def test_every_training_option_reaches_the_stage_s_overrides(name, monkeypatch):
    import cudal1.train.config

    seen = {}

    def load(cls, path, overrides):
        seen.update(overrides)
        raise Reached

    monkeypatch.setattr(cudal1.train.config, "load_config", load)
    argv, expected = _walk(COMMANDS[name])
    outcome = CliRunner().invoke(app, [*name.split(), *argv, "--set", "seed=3"])
    assert isinstance(outcome.exception, Reached), outcome.output
    assert {field: seen.get(field) for _, field, _ in expected.values()} == \
        {field: value for _, field, value in expected.values()}
    assert seen["seed"] == 3


def test_options_not_given_leave_the_stage_yaml_alone(monkeypatch):
    import cudal1.train.config

    seen = {}
    monkeypatch.setattr(cudal1.train.config, "load_config", lambda cls, path, overrides: seen.update(overrides))
    monkeypatch.setattr("cudal1.train.rl.run_rl", lambda config: (_ for _ in ()).throw(Reached()), raising=False)
    CliRunner().invoke(app, ["train", "rl", "--model", "scratch"])
    assert seen == {"model": "scratch"}


def test_every_serve_option_reaches_the_server_and_evaluation_configs(monkeypatch):
    server = pytest.importorskip("cudal1.service.server")
    seen = []

    def serve(config, eval_config, **kwargs):
        seen.extend([config, eval_config])
        raise Reached

    monkeypatch.setattr(server, "serve", serve)
    argv, expected = _walk(COMMANDS["serve"])
    outcome = CliRunner().invoke(app, ["serve", *argv, "--memory-gb", "2", "--set", "warm_buckets=1"])
    assert isinstance(outcome.exception, Reached), outcome.output
    _check(expected, seen)
    assert seen[1].memory_bytes == 2 * 2**30 and seen[1].warm_buckets == 1


def test_set_converts_to_the_field_s_type_and_names_the_option():
    assert parse_sets(EvalConfig, ["warm-buckets=0", "flush_l2=no", "memory_bytes=null", "target_bucket_ms=20"]) \
        == {"warm_buckets": 0, "flush_l2": False, "memory_bytes": None, "target_bucket_ms": 20.0}
    with pytest.raises(ConfigError, match="bad --set 'nope=1'"):
        parse_sets(EvalConfig, ["nope=1"])
    with pytest.raises(ConfigError, match="bad value for --eval-set buckets"):
        parse_sets(EvalConfig, ["buckets=many"], "--eval-set")
