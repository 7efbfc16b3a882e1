"""The policy's vocabulary, prompts and prompt styles (experimental.contrastive_study.prompting)."""

from __future__ import annotations

import re

from cudal1.exemplars import ExemplarDB
from cudal1.tasks.task import Task
from experimental.contrastive_study.prompting import (
    SCORE_LEVELS,
    StudyPromptBuilder,
    make_tokenizer,
    prompt_text,
    score_token,
)

FEATURES = ["row", "in1", "heavy", "p3", "fullout", "r16", "c11"]


def test_scores_round_to_the_log_grid():
    assert score_token(1.0) == "1x" and score_token(2.2) == "2.24x" and score_token(100.0) == "20x"
    assert score_token(0.0) == "0.0501x" and len(set(SCORE_LEVELS)) == len(SCORE_LEVELS)


def test_every_prompt_token_is_in_the_vocabulary():
    tok = make_tokenizer()
    text = prompt_text(FEATURES, [("T64 V1 I1 O S0 M0", 0.63), ("T256 V4 I2 G S1 M0", 2.2)]) + " T1024 V2 I8 O S1 M1"
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.unk_token_id not in ids and len(ids) == len(text.split())
    assert tok.decode(ids) == text


def test_prompt_styles(tmp_path):
    db = ExemplarDB(tmp_path / "ex.sqlite")
    task = Task("study/x", "class Model: pass\n")
    for recipe, score in (("T64 V1 I1 O S0 M0", 0.5), ("T128 V2 I2 O S0 M0", 1.0), ("T256 V4 I4 G S0 M0", 2.0),
                          ("T512 V4 I8 G S1 M1", 4.0)):
        db.add(task.id, recipe, score)
    features = {task.id: FEATURES}
    plain = StudyPromptBuilder(db, "plain", 4, features).build(task)
    assert plain == "row in1 heavy p3 fullout r16 c11 : =>"
    bucket = StudyPromptBuilder(db, "bucket", 4, features).build(task)
    assert bucket.count(";") == 4 and "T512 V4 I8 G S1 M1 3.98x ; =>" in bucket  # best last
    pairs = set()
    for seed in range(20):
        text = StudyPromptBuilder(db, "shuffled", 4, features, seed=seed).build(task, step=seed)
        shown = re.findall(r"(T\d+ V\d I\d [OG] S\d M\d) ([\d.]+)x", text)
        scores = [float(s) for _, s in shown]
        assert scores == sorted(scores)  # shown in the order of the (permuted) scores
        pairs |= set(shown)
    assert len(pairs) > 4  # the scores moved between recipes
