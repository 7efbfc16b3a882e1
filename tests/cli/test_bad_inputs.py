"""Every command, driven with bad input a user can give: one line naming the input (and the limit or what was
expected), exit 2, never "unexpected ... (a bug: please report it)" and never a traceback. The "unexpected"
path is for bugs of ours only.

The corpus holds the inputs a newcomer's walk-through found (a 60 MB candidate, release rows with a string
score, a null task id, duplicated rows, a 5 MB reference beside normal rows, `--set learning_rate=nan`,
`train -o FILE`, an empty YAML) and the README's error contract (a missing or unreadable file, an unknown task,
an invalid option), for every command. Each case fails before any runner starts (the suite stays fast)."""

from __future__ import annotations

import json
from pathlib import Path

from cudal1.cli.main import main
from cudal1.tasks.task import MAX_SOURCE_BYTES
from tests.cli.test_option_names import COMMANDS, unknown_options

FIXTURES = Path(__file__).parent.parent / "fixtures"
REF = FIXTURES / "tasks" / "tiny_scale_add.py"
GOOD = FIXTURES / "eval" / "correct.py"
OVER = "#" * (MAX_SOURCE_BYTES + 1)  # one byte over the size limit of a source
LIMIT = "over the limit of 524288 bytes"


def _rows(**changes) -> list[dict]:
    return [{"level_id": 1, "task_id": 1, "ref_code": REF.read_text(), "custom_code": GOOD.read_text(),
             "score_default": 2.0, **changes}]


def _files(tmp: Path) -> dict[str, Path]:
    """The bad (and a few good) files the cases name."""
    def jsonl(name: str, rows: list) -> Path:
        path = tmp / name
        path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
        return path

    good_row = _rows(task_id=2)[0]
    files = {
        "big_candidate": tmp / "big_candidate.py", "big_ref": tmp / "big_ref.py", "binary": tmp / "binary.py",
        "syntax_ref": tmp / "syntax_ref.py", "no_model_ref": tmp / "no_model_ref.py", "afile": tmp / "afile",
        "empty_yaml": tmp / "empty.yaml", "list_yaml": tmp / "list.yaml", "broken_yaml": tmp / "broken.yaml",
        "string_score": jsonl("string_score.jsonl", _rows(score_default="fast")),
        "big_custom": jsonl("big_custom.jsonl", [*_rows(custom_code=OVER), good_row]),
        "big_reference": jsonl("big_reference.jsonl", [good_row, *_rows(ref_code=REF.read_text() + OVER)]),
        "null_task": jsonl("null_task.jsonl", _rows(task_id=None)),
        "duplicates": jsonl("duplicates.jsonl", [*_rows(), *_rows(score_default=3.0)]),
        "nan_score": jsonl("nan_score.jsonl", [json.dumps(_rows()[0])[:-1] + ', "score_cudnn": NaN}']),
        "not_json": jsonl("not_json.jsonl", ["{not json"]),
        "array_row": jsonl("array_row.jsonl", [[1, 2, 3]]),
        "string_level": jsonl("string_level.jsonl", _rows(level_id="one")),
        "number_code": jsonl("number_code.jsonl", _rows(custom_code=12)),
        "no_ref": jsonl("no_ref.jsonl", [{"level_id": 1, "task_id": 1, "custom_code": "x"}]),
        "negative_score": jsonl("negative_score.jsonl", _rows(score_cuda_graph=-1)),
    }
    files["big_candidate"].write_text(GOOD.read_text() + OVER)
    files["big_ref"].write_text(REF.read_text() + OVER)
    files["binary"].write_bytes(b"\xff\xfe\x00junk")
    files["syntax_ref"].write_text("import torch\ndef get_inputs(:\n")
    files["no_model_ref"].write_text("def get_inputs():\n    return []\n")
    files["afile"].write_text("x")
    files["empty_yaml"].write_text("# settings to come\n")
    files["list_yaml"].write_text("- learning_rate\n")
    files["broken_yaml"].write_text("learning_rate: [1\n")
    return files


def corpus(tmp: Path) -> list[tuple[list[str], str]]:
    """(argv, words the one-line error must hold) for each bad input."""
    f = {k: str(v) for k, v in _files(tmp).items()}
    ref, good, store = str(REF), str(GOOD), str(tmp / "store.sqlite")
    fast = ["--device", "cpu", "--trials", "2", "--buckets", "2"]
    one = ["eval", "--ref", ref, "--candidate", good, "--no-store", *fast]
    batch = ["eval", "--no-store", *fast, "--release"]
    train_rl = ["train", "rl", "--model", "scratch", "-o", str(tmp / "run")]
    train_sft = ["train", "sft", "--model", "scratch", "--dataset", f["afile"], "-o", str(tmp / "run")]
    return [
        # eval: files
        (["eval", "--ref", ref, "--candidate", f["big_candidate"], "--no-store", *fast], LIMIT),
        (["eval", "--ref", f["big_ref"], "--candidate", good, "--no-store", *fast], "the reference cannot be evaluated"),
        (["eval", "--ref", ref, "--candidate", f["binary"], "--no-store"], "is not UTF-8 text"),
        (["eval", "--ref", ref, "--candidate", str(tmp), "--no-store"], "is a folder"),
        (["eval", "--ref", ref, "--candidate", str(tmp / "nowhere.py"), "--no-store"], "no such candidate file"),
        (["eval", "--ref", f["syntax_ref"], "--candidate", good, "--no-store"], "syntax error at line 2"),
        (["eval", "--ref", f["no_model_ref"], "--candidate", good, "--no-store"], "missing Model"),
        (["eval", "--ref", ref, "--task", "softmax_manual_lastdim", "--candidate", good, "--no-store"],
         "exactly one of --ref FILE or --task ID"),
        (["eval", "--no-store"], "give --candidate"),
        (["eval", "--task", "no_such_task", "--candidate", good, "--no-store"], "no task 'no_such_task'"),
        (["eval", "--candidates-dir", str(tmp / "nowhere"), "--no-store"], "no such folder"),
        # eval: release rows
        ([*batch, f["string_score"]], 'score_default is "fast", not a published speedup'),
        ([*batch, f["big_custom"]], "custom_code cannot be evaluated: it is"),
        ([*batch, f["big_reference"]], "big_reference.jsonl:2: ref_code cannot be evaluated"),
        ([*batch, f["null_task"]], "task_id is null"),
        ([*batch, f["duplicates"]], "repeats line 1: one row per task"),
        ([*batch, f["nan_score"]], "NaN is not a number JSON allows"),
        ([*batch, f["not_json"]], "not a release row (not JSON"),
        ([*batch, f["array_row"]], "not a release row: it is [1, 2, 3]"),
        ([*batch, f["string_level"]], 'level_id is "one", not an integer'),
        ([*batch, f["number_code"]], "custom_code is 12"),
        ([*batch, f["no_ref"]], "ref_code is missing"),
        ([*batch, f["negative_score"]], "score_cuda_graph is -1"),
        ([*batch, str(tmp / "nowhere.jsonl")], "no such release file"),
        ([*batch, f["string_score"], "--limit", "0"], "'--limit'"),
        # eval: options
        ([*one, "--bracket-work-ms", "nan"], "'--bracket-work-ms'"),
        ([*one, "--timeout-s", "inf"], "'--timeout-s': inf is not a finite number"),
        ([*one, "--timeout-s", "-1"], "-1 is not > 0"),
        ([*one, "--trials", "0"], "'--trials'"),
        ([*one, "--device", "gpu"], "'--device'"),
        ([*one, "--profile", "kernelbench-v1"], "Invalid value for '--profile'"),
        ([*one, "--sandbox", "maybe"], "'--sandbox'"),
        ([*one, "--estimator", "mean"], "'--estimator'"),
        ([*one, "--runner-pairs", "0"], "'--runner-pairs'"),
        ([*one, "--policy", "no-such-policy"], "no-such-policy"),
        ([*one, "--store", store], "not both"),
        (["eval", "--candidate", good, "--ref", ref, "--bogus"], "No such option: --bogus"),
        # check, tasks, judge
        (["check", f["binary"]], "is not UTF-8 text"),
        (["check", f["big_candidate"]], LIMIT),
        (["check", str(tmp / "nowhere.py")], "no such candidate file"),
        (["explain", str(tmp / "nowhere.json")], "cannot read"),
        (["explain", f["binary"]], "cannot read"),
        (["tasks", "list", "--source", str(tmp / "nowhere")], "unknown task source"),
        (["tasks", "list", "--source", "jsonl:" + f["null_task"]], "task_id is null"),
        (["tasks", "show", "no/such/task"], "no task 'no/such/task'"),
        (["judge", good, "--ref", ref, "--result", f["afile"], "--prompt-only", "--store", store],
         "is not a cudal1 eval --json result"),
        (["hacks", "seed", "--manifest", str(tmp / "nowhere.yaml"), "--store", store], "no such file"),
        (["hacks", "add", f["big_candidate"], "--rule", "result_caching", "--store", store], LIMIT),
        (["hacks", "similar", f["binary"], "--store", store], "is not UTF-8 text"),
        (["hacks", "list", "--store", f["afile"]], "afile"),
        # audit, audit-compare, report, baseline
        (["audit", f["string_score"], "--out", str(tmp / "aud"), "--store", store], 'score_default is "fast"'),
        (["audit", f["big_reference"], "--out", str(tmp / "aud"), "--store", store], "ref_code cannot be evaluated"),
        (["audit", str(tmp / "nowhere.jsonl"), "--out", str(tmp / "aud"), "--store", store], "no such release file"),
        (["audit", f["duplicates"], "--out", str(Path(f["afile"]) / "sub"), "--store", store],
         "cannot create output folder"),
        (["audit", f["duplicates"], "--out", str(tmp / "aud"), "--tolerance", "nan"], "'--tolerance'"),
        (["audit", f["duplicates"], "--out", str(tmp / "aud"), "--time-budget-s", "inf"], "'--time-budget-s'"),
        (["audit-compare", str(tmp / "nowhere1"), str(tmp / "nowhere2")], "nowhere1"),
        # the audit by chunks
        (["audit-chunk", str(tmp / "nowhere.jsonl"), "-o", str(tmp / "chunk"), "--device", "cpu"], "nowhere.jsonl"),
        (["audit-chunk", "h100", "-o", str(tmp / "chunk"), "--device", "cpu", "--data-dir", str(tmp / "none")],
         "no release 'h100'"),
        (["audit-chunk", "h100", "-o", str(tmp / "chunk"), "--budget-s", "nan"], "'--budget-s'"),
        (["audit-ingest", str(tmp / "no-records")], "no chunk record"),
        (["audit-ingest", f["afile"], "--audit-dir", str(tmp / "empty-audit")], "afile"),
        (["audit-pages", "--audit-dir", str(tmp / "empty-audit")], "holds no static records"),
        (["report", "--out", f["afile"], "--store", store], "is a file, not a folder"),
        (["report", "--out", str(tmp / "rep"), "--store", str(tmp / "none.sqlite")], "no results store"),
        (["baseline", "--task", "no_such_task", "--device", "cpu", "--store", store], "no task no_such_task"),
        (["baseline", "--kind", "fastest", "--device", "cpu", "--store", store], "fastest"),
        (["baseline", "--timeout-s", "nan", "--device", "cpu", "--store", store], "'--timeout-s'"),
        # augment, optimize, quickstart, evaluate-policy, serve
        (["augment", "--from-release", f["string_score"], "-o", str(tmp / "sft")], 'score_default is "fast"'),
        (["augment", "--from-release", f["duplicates"], "-o", str(tmp / "sft")], "repeats line 1"),
        (["augment", "-o", str(tmp / "sft")], "at least one --llm, --from-release PATH or --from-examples"),
        (["augment", "--from-examples", "-o", str(tmp / "sft"), "--max-slowdown", "inf"], "'--max-slowdown'"),
        (["augment", "--from-examples", "-o", str(tmp / "sft"), "--temperature", "nan"], "'--temperature'"),
        (["optimize", "x", "--llm", "openai:m", "--rounds", "0"], "'--rounds'"),
        (["optimize", "softmax_manual_lastdim", "--llm", "openai:m", "--eval-set", "timeout_s=nan"],
         "timeout_s must be a finite number"),
        (["optimize", "softmax_manual_lastdim", "--llm", "openai:m", "--eval-set", "nope=1"], "bad --eval-set"),
        (["optimize", "softmax_manual_lastdim", "--llm", "openai:m", "--temperature", "inf"], "'--temperature'"),
        (["optimize", f["big_ref"], "--llm", "openai:m", "--device", "cpu"], "the reference cannot be evaluated"),
        (["quickstart", "--form", "bogus", "--device", "cpu", "--no-store"], "unknown example form"),
        (["quickstart", "--sandbox", "never", "--device", "cpu", "--no-store"], "'--sandbox'"),
        (["evaluate-policy", "x", "--temperature", "nan"], "'--temperature'"),
        (["serve", "--max-queue", "0"], "'--max-queue'"),
        (["serve", "--request-timeout-s", "nan"], "'--request-timeout-s'"),
        (["serve", "--memory-gb", "inf"], "'--memory-gb'"),
        # train
        ([*train_sft, "--set", "learning_rate=nan"], "learning_rate must be a finite number, got nan"),
        ([*train_rl, "--set", "reward_clip_k=inf"], "reward_clip_k must be a finite number"),
        ([*train_rl, "--set", "temperature=.nan"], "temperature must be a finite number"),
        ([*train_rl, "--set", "learning_rate=-1e-5"], "learning_rate must be > 0"),
        ([*train_rl, "--set", "seed=-1"], "seed must be in [0, 4294967295]"),
        ([*train_rl, "--set", "warmup_ratio=2"], "warmup_ratio must be in [0, 1]"),
        ([*train_rl, "--set", "eval_timeout_s=0"], "eval_timeout_s must be > 0"),
        ([*train_rl, "--set", "failure_rewards={compile_error: .nan}"], "failure_rewards must map statuses"),
        ([*train_rl, "--set", "learning_rate=fast"], "learning_rate must be float"),
        ([*train_rl, "--set", "no_such_setting=1"], "unknown RLStageConfig settings: no_such_setting"),
        ([*train_rl, "--set", "eval_sandbox=never"], "eval_sandbox must be one of auto, required, none"),
        ([*train_rl, "--sandbox", "never"], "eval_sandbox must be one of"),
        ([*train_rl, "--set", "noequals"], "is not KEY=VALUE"),
        (["train", "rl", "--model", "scratch", "-o", f["afile"]], f"output_dir {f['afile']} is a file, not a folder"),
        ([*train_sft, "--config", f["empty_yaml"]], "is empty (no settings)"),
        ([*train_rl, "--config", f["list_yaml"]], "must be a mapping of settings, not a list"),
        ([*train_rl, "--config", f["broken_yaml"]], "cannot read config"),
        ([*train_rl, "--config", str(tmp / "nowhere.yaml")], "cannot read config"),
        (["train", "sft", "--model", "scratch", "-o", str(tmp / "run")], "set dataset"),
        (["train", "self-supervised", "--model", "scratch", "-o", str(tmp / "run"), "--set", "top_p=nan"],
         "top_p must be a finite number"),
        (["train", "self-supervised", "--model", "scratch", "-o", str(tmp / "run"), "--set", "top_p=1.5"],
         "top_p must be in (0, 1]"),
        (["train", "rl", "-o", str(tmp / "run")], "set model"),
        *([([*train_rl, "--set", "eval_device=cuda"], "no CUDA GPU is visible; use --set eval_device=cpu"),
           (["quickstart", "--device", "cuda", "--no-store"], "no CUDA GPU is visible; use --device cpu")]
          if not _has_gpu() else []),
    ]


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def test_the_corpus_covers_every_command_and_the_walk_through(tmp_path):
    cases = corpus(tmp_path)
    commands = {" ".join(argv[:2]) if argv[0] in ("train", "tasks", "hacks") else argv[0] for argv, _ in cases}
    missing = set(COMMANDS) - commands
    assert not missing, missing
    assert len(cases) >= 80


def test_every_bad_input_is_one_line_naming_it_exit_2_and_never_a_bug(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "500")
    failures = []
    for argv, words in corpus(tmp_path):
        code = main(argv)
        captured = capsys.readouterr()
        err = captured.err.strip()
        command = " ".join(argv[:2]) if argv[0] in ("train", "tasks", "hacks") else argv[0]
        problems = [
            code != 2 and f"exit {code}",
            len(err.splitlines()) != 1 and f"{len(err.splitlines())} lines",
            "unexpected" in err and "a bug" in err and "an 'unexpected' error",
            "Traceback" in captured.err + captured.out and "a traceback",
            words not in " ".join(err.split()) and f"no {words!r}",
            # (a mistyped option is named as typed, with the command's own options to choose from)
            "No such option" not in err and unknown_options(err, command) and f"names {unknown_options(err, command)}",
        ]
        if any(problems):
            failures.append((argv, [p for p in problems if p], err[-400:]))
    assert failures == [], "\n".join(map(str, failures))
    assert not (tmp_path / "aud").exists() and not (tmp_path / "sft").exists()  # nothing left half-made
