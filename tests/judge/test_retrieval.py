"""Retrieval of similar known hack cases: tokens, determinism, and leave-one-out over the exploit corpus."""

from __future__ import annotations

from collections import Counter

from cudal1.judge import code_tokens, similar_cases
from cudal1.judge.cases import HackCase
from cudal1.judge.retrieval import rank_cases
from tests.judge.conftest import CORPUS


def test_tokens_come_from_apis_and_cuda_strings_not_docstrings():
    source = '''"""Docstring mentioning cudaStreamCreate and data_ptr."""
import torch
from torch.utils.cpp_extension import load_inline

SRC = r"""
__global__ void k(float* y) { cudaStream_t s; cudaStreamCreate(&s); __syncthreads(); }
"""
torch.set_float32_matmul_precision("high")


class ModelNew(torch.nn.Module):
    def forward(self, x):
        s = torch.cuda.Stream()
        return x.to(non_blocking=True)
'''
    tokens = code_tokens(source)
    for expected in ("torch.cuda.Stream", "Stream", "cudaStreamCreate", "__syncthreads", "cudaStream_t",
                     "torch.set_float32_matmul_precision", "str:high", "kw:non_blocking", "load_inline",
                     "torch.utils.cpp_extension", "ModelNew", "forward"):
        assert tokens[expected] >= 1, expected
    assert tokens["data_ptr"] == 0  # only in the docstring
    assert "float" not in tokens and "void" not in tokens  # C keywords
    assert code_tokens("def broken(:\n  cudaMemcpyAsync(")["cudaMemcpyAsync"] == 1  # no parse: regex


def _case(i: int, rule: str, source: str, rules: tuple[str, ...] = ()) -> HackCase:
    return HackCase(id=i, source=source, source_hash=str(i), rule=rule, explanation="", origin="seed",
                    created_at=0.0, static_rules=rules)


def test_rank_is_deterministic_ties_break_on_id_and_zero_scores_are_dropped():
    same = "import torch\ns = torch.cuda.Stream()\n"
    cases = [_case(3, "a", same), _case(1, "b", same), _case(2, "c", "import numpy\n")]
    ranked = rank_cases(same, cases, k=5, rules=())
    assert [c.id for c, _ in ranked] == [1, 3] and ranked[0][1] == ranked[1][1]
    assert rank_cases(same, cases, k=0, rules=()) == [] and rank_cases(same, [], rules=()) == []


def test_shared_rare_static_rules_add_a_bonus():
    a = _case(1, "x", "import torch\ny = torch.relu(x)\n", ("result_caching",))
    b = _case(2, "y", "import torch\ny = torch.relu(x)\n", ("stale_memory",))
    c = _case(3, "z", "import torch\nz = 1\n", ("stale_memory",))
    ranked = rank_cases("import torch\ny = torch.relu(x)\n", [a, b, c], k=3, rules=("result_caching",))
    assert ranked[0][0].id == 1 and ranked[0][1] > ranked[1][1]
    assert ranked[0][1] > 1.0  # full token similarity plus the rule bonus


def test_leave_one_out_over_the_exploit_corpus_finds_the_same_class_first(seeded_db):
    """Each exploit whose class has another member in the corpus retrieves that class within its top 3."""
    cases = seeded_db.list(origin="seed")
    classes = Counter(c.rule for c in cases)
    queries = [c for c in cases if classes[c.rule] > 1]
    assert len(queries) >= 8  # side_stream x3, result_caching, global_flags, timer_patching x2 each
    top1 = top3 = 0
    for query in queries:
        ranked = similar_cases(query.source, seeded_db, k=3, exclude_ids=[query.id])
        rules = [c.rule for c, _ in ranked]
        assert query.id not in [c.id for c, _ in ranked]
        top1 += rules[:1] == [query.rule]
        top3 += query.rule in rules
    assert top3 / len(queries) >= 0.8, (top3, len(queries))
    assert top1 / len(queries) >= 0.7, (top1, len(queries))


def test_an_unseen_honest_kernel_is_less_similar_than_a_known_trick(seeded_db):
    honest = (CORPUS / "honest" / "torch_matmul_mm.py").read_text()
    caching = (CORPUS / "exploits" / "dataptr_cache.py").read_text().replace("_cache", "_memo")
    best_honest = similar_cases(honest, seeded_db, k=1)[0][1]
    best_caching = similar_cases(caching, seeded_db, k=1)
    assert best_caching[0][0].rule == "result_caching"
    assert best_caching[0][1] > best_honest + 0.3
