"""Help texts list the choices of their tables (profiles, static presets, verdict policies), so a new entry
shows up in --help without anyone editing the option."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cudal1.analysis.presets import PRESETS as STATIC_PRESETS
from cudal1.cli.main import app
from cudal1.eval.config import PROFILES
from cudal1.policy.presets import PRESETS as POLICIES


@pytest.mark.parametrize(("argv", "table"), [
    (["eval"], PROFILES),  # --profile, shared by the commands that evaluate
    (["audit"], PROFILES),
    (["check"], STATIC_PRESETS),
    (["eval"], POLICIES),
], ids=["eval-profile", "audit-profile", "check-preset", "eval-policy"])
def test_every_table_entry_is_in_the_help(argv, table):
    # Wide, so that no name is wrapped across lines (click's wrapping also breaks at hyphens).
    outcome = CliRunner().invoke(app, [*argv, "--help"], terminal_width=1000, max_content_width=1000)
    assert outcome.exit_code == 0, outcome.output
    text = " ".join(outcome.output.split())
    missing = [name for name in table if name not in text]
    assert not missing, text


def test_describe_choices_shows_aliases_and_a_last_alternative():
    from cudal1.core.names import describe_choices

    entries = [("strict", "tight"), ("kernelbench-v0", ""), ("cuda-l1", "")]
    assert describe_choices(entries, aliases={"kernelbench": "kernelbench-v0"}) == \
        "strict (tight), kernelbench (also kernelbench-v0) or cuda-l1"
    assert describe_choices([("a", "")], or_else="a file") == "a or a file"
    assert describe_choices([("a", "")]) == "a"
