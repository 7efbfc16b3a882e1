"""`cudal1 judge` (ask an LLM whether a candidate cheats) and `cudal1 hacks` (the known hack cases).

    cudal1 judge cand.py --ref ref.py --llm openai:MODEL@http://127.0.0.1:8000/v1
    cudal1 judge cand.py --ref ref.py --prompt-only          # show what the judge would be asked
    cudal1 hacks seed --manifest tests/fixtures/candidates/manifest.yaml
    cudal1 hacks list | add FILE --rule R | similar FILE

Both read and write the `hack_cases` table of the results store (`--store`, default the user store).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cudal1.cli import common
from cudal1.core.errors import ConfigError, SourceError

hacks_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="The database of known reward-hack cases.")

StoreOpt = typer.Option(None, "--store", help="Results database holding the cases (default: user data dir "
                                              "or $CUDAL1_STORE).")


CandidateArg = typer.Argument(..., help="Candidate module (defines ModelNew).")
RequiredRefOpt = typer.Option(..., "--ref", help="Reference module (Model, get_inputs, get_init_inputs).")
RefOpt = typer.Option(None, "--ref", help="Its reference module (sharpens the static rules).")
ResultOpt = typer.Option(None, "--result", help="The evaluation's JSON (`cudal1 eval --json`) as evidence; "
                                                "default: static analysis only.")
ManifestOpt = typer.Option(..., "--manifest",
                           help="Candidate-corpus manifest.yaml (its exploits become cases).")


def _read(path: Path | None, what: str = "input") -> str | None:
    return None if path is None else common.read_source(path, what)


def _db(store: Path | None):
    from cudal1.judge import HackCaseDB

    return HackCaseDB(store)


def judge_command(
    candidate: Path = CandidateArg,
    ref: Path = RequiredRefOpt,
    llm: str | None = typer.Option(None, "--llm", help="Judge model: 'openai:MODEL@http://host:port/v1'."),
    result: Path | None = ResultOpt,
    k: int = typer.Option(3, "--k", help="Similar known cases shown to the judge."),
    store: Path | None = StoreOpt,
    record: bool = typer.Option(True, "--record/--no-record", help="Add a 'cheats' verdict to the cases."),
    prompt_only: bool = typer.Option(False, "--prompt-only", help="Print the judge's prompt; ask no LLM."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
) -> None:
    """Ask an LLM judge whether a candidate cheats.

    Ask an LLM judge whether a candidate cheats, with similar known hack cases as context.

    Exit code 1 when the judge says it cheats.
    """
    from cudal1.core.types import EvalResult
    from cudal1.judge import JudgeConfig, LLMJudge

    cand_src, ref_src = _read(candidate, "candidate"), _read(ref, "reference")
    evidence = None
    if result is not None:
        try:
            evidence = EvalResult.from_dict(json.loads(_read(result, "result")))
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"--result {result} is not a cudal1 eval --json result ({type(exc).__name__}: "
                              f"{exc})") from None
    config = JudgeConfig(llm=llm, k_cases=k, record_verdicts=record)
    db = _db(store)
    if prompt_only:
        judge = LLMJudge(config, db, backend=object())  # never asked
        messages, _ = judge.prompt(ref_src, cand_src, evidence)
        for m in messages:
            typer.echo(f"===== {m['role']} =====\n{m['content']}\n")
        return
    if not config.enabled:
        raise ConfigError("the judge is off: give --llm openai:MODEL@http://host:port/v1 "
                          "(or use --prompt-only)")
    verdict = LLMJudge(config, db).judge(ref_src, cand_src, evidence)
    if as_json:
        typer.echo(json.dumps(verdict.to_dict()))
    else:
        said = {True: "CHEATS", False: "clean", None: "inconclusive"}[verdict.cheats]
        typer.echo(f"{said}" + (f" ({verdict.rule})" if verdict.rule else "") + f": "
                   f"{verdict.error or verdict.explanation}")
        if verdict.recorded_case_id is not None:
            typer.echo(f"recorded as hack case {verdict.recorded_case_id}")
    if verdict.cheats:
        raise typer.Exit(1)


@hacks_app.command("list")
def hacks_list(
    store: Path | None = StoreOpt,
    rule: str | None = typer.Option(None, "--rule", help="Only this rule."),
    origin: str | None = typer.Option(None, "--origin",
                                      help="Only this origin ('confirmed:' = all confirmed)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (sources included)."),
) -> None:
    """List the known hack cases."""
    cases = _db(store).list(rule=rule, origin=origin)
    if as_json:
        typer.echo(json.dumps([c.to_dict() for c in cases], indent=1))
        return
    for c in cases:
        typer.echo(f"{c.id:5d}  {c.rule:24s} {c.origin:18s} {c.explanation[:80]}")
    typer.echo(f"{len(cases)} case(s)")


@hacks_app.command("seed")
def hacks_seed(
    manifest: Path = ManifestOpt,
    store: Path | None = StoreOpt,
) -> None:
    """Load the exploit corpus as seed cases."""
    if not manifest.is_file():
        raise SourceError(f"no such file: {manifest}")
    db = _db(store)
    added = db.seed_from_corpus(manifest)
    typer.echo(f"{added} new seed case(s); {db.count()} in total")


@hacks_app.command("add")
def hacks_add(
    candidate: Path = CandidateArg,
    rule: str = typer.Option(..., "--rule", help="The rule it breaks (e.g. result_caching)."),
    explanation: str = typer.Option("", "--explanation", help="How it cheats, in a sentence or two."),
    ref: Path | None = RefOpt,
    store: Path | None = StoreOpt,
) -> None:
    """Add one confirmed hack case by hand."""
    case_id = _db(store).add(_read(candidate), rule, explanation, "manual", reference_source=_read(ref))
    typer.echo(f"added case {case_id}" if case_id is not None else "already known (same normalised source)")


@hacks_app.command("similar")
def hacks_similar(
    candidate: Path = CandidateArg,
    ref: Path | None = RefOpt,
    k: int = typer.Option(3, "--k", help="How many cases."),
    store: Path | None = StoreOpt,
) -> None:
    """Show the known cases most similar to a candidate."""
    from cudal1.judge import similar_cases

    for case, score in similar_cases(_read(candidate), _db(store), k=k, reference_source=_read(ref)):
        typer.echo(f"{score:5.2f}  case {case.id:4d}  {case.rule:24s} {case.explanation[:70]}")


def register(app: typer.Typer) -> None:
    """Add `cudal1 judge` and `cudal1 hacks` to the CLI."""
    app.command("judge")(judge_command)
    app.add_typer(hacks_app, name="hacks")
