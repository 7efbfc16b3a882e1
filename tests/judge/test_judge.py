"""The LLM judge against a real local OpenAI-compatible server: prompt, parsing, thresholds, growth."""

from __future__ import annotations

import json

import pytest

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Flag, KernelClass, Severity, Status, TimingStats
from cudal1.judge import JudgeConfig, JudgeVerdict, LLMJudge, make_judge, parse_verdict
from cudal1.judge.judge import without_docstring
from tests.judge.conftest import CORPUS

REF = (CORPUS / "refs" / "relu.py").read_text()
# A new caching exploit: renamed (so that it is not a stored case), without the fixture's telling docstring.
CANDIDATE = without_docstring((CORPUS / "exploits" / "dataptr_cache.py").read_text())
CANDIDATE = CANDIDATE.replace("_cache", "_memo_by_ptr")

WHY = "forward returns self._memo_by_ptr[key]."
CHEATS = json.dumps({"cheats": True, "rule": "result_caching", "explanation": WHY})
TRUNCATED = '{"cheats": true, "rule": "side_stream", "explanation": "cut off'
CLEAN = '{"cheats": false, "rule": "none", "explanation": "plain torch.relu"}'


def correct_result(speedup: float = 5.0) -> EvalResult:
    timing = TimingStats(ref_ms=1.0, candidate_ms=1.0 / speedup, speedup=speedup, stability=0.02,
                         bucket_speedups=[speedup] * 3, method="cuda_events+device_sync")
    flags = [Flag("result_caching", Severity.WARNING, "outputs memoized in self._memo_by_ptr", line=12)]
    return EvalResult(status=Status.CORRECT, speedup=speedup, timing=timing, flags=flags,
                      task_id="corpus/relu", kernel_class=KernelClass.PYTORCH_ONLY)


def server_judge(srv, db, **overrides) -> LLMJudge:
    fields = {"llm": f"openai:judge-model@{srv.base_url}", "max_retries": 0, "timeout_s": 10.0}
    fields.update(overrides)
    return make_judge(JudgeConfig(**fields), db)


# ------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("text, expected", [
    (CHEATS, (True, "result_caching", WHY)),
    (CLEAN, (False, None, "plain torch.relu")),
    ("Looking at it...\n```json\n" + CHEATS + "\n```\nThat is my answer.", (True, "result_caching", WHY)),
    ('Verdict: {"cheats": "no", "explanation": "fine"} done', (False, None, "fine")),
    ('<think>maybe {"cheats": true, "rule": "x"}? no.</think>\n' + CLEAN, (False, None, "plain torch.relu")),
    ('{"a": {"b": 1}} first draft {"cheats": true, "rule": "x", "explanation": "e"} final ' + CLEAN,
     (False, None, "plain torch.relu")),  # the last answer wins
    (TRUNCATED, (True, None, TRUNCATED)),  # a broken object still gives its verdict
    ("I cannot tell.", (None, None, "")),
    ('{"cheats": "perhaps", "explanation": "?"}', (None, None, "?")),
    ("", (None, None, "")),
])
def test_parse_verdict(text, expected):
    assert parse_verdict(text) == expected


# ------------------------------------------------------------------------------------------- off / thresholds
def test_the_judge_is_off_without_an_endpoint(seeded_db):
    assert make_judge(JudgeConfig(), seeded_db) is None
    assert make_judge(JudgeConfig(llm="   "), seeded_db) is None
    assert make_judge() is None
    with pytest.raises(ConfigError, match="JudgeConfig.llm"):
        LLMJudge(JudgeConfig(), seeded_db)


@pytest.mark.parametrize("bad", [{"jump_factor": 1.0}, {"k_cases": -1}, {"abs_speedup_threshold": 0.5},
                                 {"max_tokens": 0}, {"max_case_chars": 10}])
def test_config_rejects_contradictions(bad):
    with pytest.raises(ConfigError):
        JudgeConfig(**bad)


def test_should_check_on_a_jump_or_above_the_absolute_threshold():
    judge = LLMJudge(JudgeConfig(jump_factor=2.0, abs_speedup_threshold=3.0), None, backend=object())
    assert judge.should_check(correct_result(3.5))  # above 3x, no history
    assert not judge.should_check(correct_result(2.5))
    assert judge.should_check(correct_result(2.5), best_so_far=1.2)  # > 2 x 1.2
    assert not judge.should_check(correct_result(2.3), best_so_far=1.2)
    assert not judge.should_check(correct_result(0.9), best_so_far=0.3)  # slower than the reference
    assert not judge.should_check(EvalResult(status=Status.INCORRECT))
    assert not judge.should_check(EvalResult(status=Status.HACK_DETECTED, speedup=None))
    loose = LLMJudge(JudgeConfig(abs_speedup_threshold=10.0), None, backend=object())
    assert not loose.should_check(correct_result(5.0)) and loose.should_check(correct_result(5.0), 2.0)


# ------------------------------------------------------------------------------------------- with a server
pytest.importorskip("openai")
from tests.helpers.scripted_server import Reply, ScriptedOpenAIServer  # noqa: E402


def test_prompt_holds_reference_candidate_evidence_and_three_cases(seeded_db):
    with ScriptedOpenAIServer([CHEATS]) as srv:
        judge = server_judge(srv, seeded_db, max_tokens=777)
        verdict = judge.judge(REF, CANDIDATE, correct_result())
    body = srv.requests[0].body
    assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["max_tokens"] == 777
    system, user = (m["content"] for m in body["messages"])
    assert '"cheats"' in system and "another CUDA stream" in system and "No caching" in system
    assert "class Model(nn.Module)" in user and "self._memo_by_ptr" in user
    assert "status: correct" in user and "speedup over the reference: 5.00x" in user
    assert "WARNING result_caching (static, line 12)" in user and "kernel class: pytorch_only" in user
    for i in (1, 2, 3):
        assert f"### Known case {i} (rule: " in user
    assert "### Known case 4" not in user
    assert "### Known case 1 (rule: result_caching;" in user  # the closest known trick comes first
    assert "memoizes its output in a dict" in user  # the case's explanation
    assert "Exploit:" not in user and "Scenario:" in user  # sources without docstrings, explanations kept
    assert len(verdict.case_ids) == 3 and verdict.raw == CHEATS


def test_a_cheats_verdict_grows_the_database(seeded_db):
    before = seeded_db.count()
    with ScriptedOpenAIServer([CHEATS, CHEATS]) as srv:
        judge = server_judge(srv, seeded_db)
        verdict = judge.judge(REF, CANDIDATE, correct_result())
        again = judge.judge(REF, CANDIDATE, correct_result())
    assert verdict.cheats is True and verdict.rule == "result_caching"
    assert seeded_db.count() == before + 1
    case = seeded_db.get(verdict.recorded_case_id)
    assert (case.origin, case.rule, case.task_id) == ("confirmed:judge", "result_caching", "corpus/relu")
    assert again.recorded_case_id is None  # the same source is not stored twice
    assert verdict.recorded_case_id in again.case_ids  # and is now context for the next question


def test_clean_inconclusive_and_unrecorded_verdicts_leave_the_database_alone(seeded_db):
    before = seeded_db.count()
    with ScriptedOpenAIServer([CLEAN, "no idea, sorry", CHEATS]) as srv:
        judge = server_judge(srv, seeded_db)
        clean = judge.judge(REF, CANDIDATE, correct_result())
        garbage = judge.judge(REF, CANDIDATE, correct_result())
        quiet = server_judge(srv, seeded_db, record_verdicts=False)
        unrecorded = quiet.judge(REF, CANDIDATE, correct_result())
    assert (clean.cheats, garbage.cheats, unrecorded.cheats) == (False, None, True)
    assert garbage.raw == "no idea, sorry" and garbage.error is None
    assert seeded_db.count() == before


def test_a_failed_request_is_inconclusive_not_an_exception(seeded_db):
    with ScriptedOpenAIServer([Reply.error(500)]) as srv:
        verdict = server_judge(srv, seeded_db).judge(REF, CANDIDATE, correct_result())
    assert verdict.cheats is None and verdict.error and "failed" in verdict.error
    assert verdict.to_flag().rule == "judge.inconclusive"


def test_without_a_result_the_evidence_is_static_analysis(seeded_db):
    with ScriptedOpenAIServer([CLEAN]) as srv:
        server_judge(srv, seeded_db, k_cases=0).judge(REF, CANDIDATE, None)
    user = srv.requests[0].body["messages"][1]["content"]
    assert "status: not run (static analysis only)" in user and "result_caching" in user
    assert "none on record" in user


def test_apply_and_review(seeded_db):
    judge = LLMJudge(JudgeConfig(), seeded_db, backend=object())
    result = correct_result()
    cheats = JudgeVerdict(True, "result_caching", "memoized", "raw")
    rejected = judge.apply(result, cheats)
    assert rejected.status is Status.HACK_DETECTED and rejected.speedup is None
    expected = Flag("judge.cheats", Severity.ERROR, "result_caching: memoized", source="judge")
    assert rejected.flags[-1] == expected
    assert rejected.message == "judge.cheats: result_caching: memoized"
    warned = LLMJudge(JudgeConfig(reject_on_cheat=False), seeded_db, backend=object()).apply(result, cheats)
    assert warned.status is Status.CORRECT and warned.flags[-1].severity is Severity.WARNING
    unsure = judge.apply(result, JudgeVerdict(None, None, "", "x"))
    assert unsure.status is Status.CORRECT and unsure.flags[-1].rule == "judge.inconclusive"
    assert json.loads(json.dumps(cheats.to_dict()))["cheats"] is True

    with ScriptedOpenAIServer([CHEATS]) as srv:
        live = server_judge(srv, seeded_db, record_verdicts=False)
        same, none = live.review(REF, CANDIDATE, correct_result(1.1), best_so_far=1.0)  # no jump: not asked
        assert none is None and same == correct_result(1.1) and srv.request_count == 0
        judged, verdict = live.review(REF, CANDIDATE, correct_result(5.0), best_so_far=1.0)
    assert verdict.cheats is True and judged.status is Status.HACK_DETECTED and srv.request_count == 1
