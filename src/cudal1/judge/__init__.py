"""Known reward-hack cases and the optional LLM judge (the paper's reasoning-model checker, fed with the
most similar known cases).

    from cudal1.judge import HackCaseDB, JudgeConfig, make_judge, similar_cases

    db = HackCaseDB()                                   # the `hack_cases` table of the results store
    db.seed_from_corpus("tests/fixtures/candidates/manifest.yaml")
    judge = make_judge(JudgeConfig(llm="openai:MODEL@http://127.0.0.1:8000/v1"), db)   # None when llm unset
    if judge is not None and judge.should_check(result, best_so_far=1.4):
        verdict = judge.judge(task_source, candidate_source, result)

The judge is off unless an LLM endpoint is configured; the case database and retrieval need nothing.
"""

from cudal1.judge.cases import HackCase, HackCaseDB, confirmed_rule, fixture_explanation
from cudal1.judge.judge import JudgeConfig, JudgeVerdict, LLMJudge, make_judge, parse_verdict
from cudal1.judge.retrieval import code_tokens, similar_cases

__all__ = [
    "HackCase",
    "HackCaseDB",
    "JudgeConfig",
    "JudgeVerdict",
    "LLMJudge",
    "code_tokens",
    "confirmed_rule",
    "fixture_explanation",
    "make_judge",
    "parse_verdict",
    "similar_cases",
]
