"""`cudal1 judge` and `cudal1 hacks` in-process (tests `cudal1/cli/judge_cmd.py`; kept here, beside the other
judge tests, until the command is registered in `cudal1/cli/main.py`)."""

from __future__ import annotations

import json

import pytest
import typer

from cudal1.cli.judge_cmd import register
from cudal1.core.errors import Cudal1Error
from tests.judge.conftest import CORPUS, MANIFEST

REF = CORPUS / "refs" / "relu.py"
CAND = CORPUS / "exploits" / "first_result_cache.py"


def run(argv: list[str]) -> int:
    """Invoke a fresh app holding only these commands; returns the exit code like `cudal1.cli.main.main`."""
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    try:
        code = app(args=argv, standalone_mode=False)  # click returns the code of a `typer.Exit` here
    except typer.Exit as exc:
        return exc.exit_code
    return code if isinstance(code, int) else 0


@pytest.mark.parametrize("argv", [["judge"], ["hacks"], ["hacks", "list"], ["hacks", "seed"],
                                  ["hacks", "add"], ["hacks", "similar"]])
def test_help(argv, capsys):
    assert run([*argv, "--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_hacks_seed_list_add_similar(tmp_path, capsys):
    store = str(tmp_path / "r.sqlite")
    assert run(["hacks", "seed", "--manifest", str(MANIFEST), "--store", store]) == 0
    assert "new seed case(s)" in capsys.readouterr().out
    assert run(["hacks", "list", "--store", store, "--json"]) == 0
    cases = json.loads(capsys.readouterr().out)
    assert cases and {c["origin"] for c in cases} == {"seed"}
    new = tmp_path / "cand.py"
    new.write_text(CAND.read_text().replace("_result", "_memo"))
    assert run(["hacks", "add", str(new), "--rule", "result_caching", "--store", store]) == 0
    assert "added case" in capsys.readouterr().out
    assert run(["hacks", "add", str(new), "--rule", "result_caching", "--store", store]) == 0
    assert "already known" in capsys.readouterr().out
    assert run(["hacks", "list", "--store", store, "--origin", "manual"]) == 0
    assert "1 case(s)" in capsys.readouterr().out
    assert run(["hacks", "similar", str(CAND), "--ref", str(REF), "--k", "2", "--store", store]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("result_caching" in line for line in lines)


def test_judge_prompt_only_needs_no_llm(tmp_path, capsys):
    store = str(tmp_path / "r.sqlite")
    run(["hacks", "seed", "--manifest", str(MANIFEST), "--store", store])
    capsys.readouterr()
    assert run(["judge", str(CAND), "--ref", str(REF), "--store", store, "--prompt-only"]) == 0
    out = capsys.readouterr().out
    assert "===== system =====" in out and "### Known case 3" in out and "static analysis only" in out


def test_judge_without_llm_is_a_one_line_user_error(tmp_path):
    with pytest.raises(Cudal1Error, match="judge is off"):
        run(["judge", str(CAND), "--ref", str(REF), "--store", str(tmp_path / "r.sqlite")])
    with pytest.raises(Cudal1Error, match="no such candidate file"):
        run(["judge", str(tmp_path / "none.py"), "--ref", str(REF), "--prompt-only"])


def test_judge_against_a_server_exits_1_on_cheats_and_records(tmp_path, capsys):
    pytest.importorskip("openai")
    from tests.helpers.scripted_server import ScriptedOpenAIServer

    store = str(tmp_path / "r.sqlite")
    answer = '{"cheats": true, "rule": "result_caching", "explanation": "returns the first result forever"}'
    with ScriptedOpenAIServer([answer, '{"cheats": false, "explanation": "ok"}']) as srv:
        llm = f"openai:judge@{srv.base_url}"
        assert run(["judge", str(CAND), "--ref", str(REF), "--llm", llm, "--store", store]) == 1
        out = capsys.readouterr().out
        assert out.startswith("CHEATS (result_caching): returns the first result forever")
        assert "recorded as hack case" in out
        assert run(["judge", str(CAND), "--ref", str(REF), "--llm", llm, "--store", store, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["cheats"] is False
    assert run(["hacks", "list", "--store", store, "--origin", "confirmed:judge"]) == 0
    assert "1 case(s)" in capsys.readouterr().out
