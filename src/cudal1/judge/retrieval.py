"""Retrieve the known hack cases most similar to a new candidate (context for the LLM judge).

No embedding model is available offline, so similarity is lexical and deterministic:

1. Tokens: identifiers and API names from the Python AST (dotted attribute chains such as
   `torch.cuda.Stream` and their last part `Stream`, names, function and class names, imports, keyword
   argument names as `kw:name`, short string constants as `str:value`) and identifiers from the CUDA/C++
   strings the candidate compiles (`cudaStreamCreate`, `__syncthreads`). Docstrings are ignored (an
   exploit's own description must not be what finds it), and so are C keywords and tiny names.
2. TF-IDF over the cases in the database (sublinear term frequency, smoothed IDF), cosine similarity.
3. A bonus for sharing static-analysis rules (`analyze_source` on the candidate; stored with each case):
   an IDF-weighted Jaccard overlap of the rule sets, times `rule_weight`. Rules that fire on almost every
   case (e.g. `stale_memory`) weigh little.

score = cosine(tokens) + rule_weight * weighted_jaccard(rules), so it lies in [0, 1 + rule_weight].
Ties break on the case id, so results are reproducible.

Limits: lexical similarity finds cases that *use the same APIs*; a new trick written with new APIs gets
low scores everywhere (which is itself a useful signal to the judge: no known case is close). Features of
all cases are recomputed per query (cached per source hash), fine for thousands of cases.
"""

from __future__ import annotations

import ast
import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from cudal1.core.syntax import parse as parse_python
from cudal1.judge.cases import HackCase, HackCaseDB, static_rules_of

__all__ = ["DEFAULT_RULE_WEIGHT", "code_tokens", "rank_cases", "similar_cases"]

# Rationale: sharing a named static rule is strong evidence of the same trick, but the rules are coarse
# (all stream tricks share `extra_cuda_stream`), so the token similarity decides within a rule.
DEFAULT_RULE_WEIGHT = 0.5

# Rationale: C/C++/CUDA keywords and the most common types say nothing about the trick.
C_STOPWORDS = frozenset("""
auto bool break case char const constexpr continue default define do double else endif enum extern false
float for if ifdef ifndef include inline int long namespace nullptr pragma restrict __restrict__ return short
signed size_t sizeof static struct template this true typedef typename unsigned using void volatile while
""".split())

# Rationale: one-letter names and loop indices are noise in both languages.
MIN_TOKEN_CHARS = 2
MAX_STRING_TOKEN_CHARS = 40
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _docstring_ids(tree: ast.AST) -> set[int]:
    """ids of bare string statements: docstrings and strings used as comments."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _code_string_tokens(text: str) -> list[str]:
    return [t for t in _IDENT.findall(text) if len(t) >= MIN_TOKEN_CHARS and t not in C_STOPWORDS]


def _looks_like_code(text: str) -> bool:
    return "__global__" in text or (";" in text and ("{" in text or "(" in text)) or "#include" in text


def _node_tokens(node: ast.AST, docstrings: set[int]) -> list[str]:
    if isinstance(node, ast.Attribute):
        dotted = _dotted(node)
        return [node.attr] + ([dotted] if dotted else [])
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return ([node.module] if node.module else []) + [a.name for a in node.names]
    if isinstance(node, ast.keyword) and node.arg:
        return [f"kw:{node.arg}"]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        if _looks_like_code(node.value):
            return _code_string_tokens(node.value)
        value = node.value.strip()
        if MIN_TOKEN_CHARS <= len(value) <= MAX_STRING_TOKEN_CHARS and "\n" not in value:
            return [f"str:{value}"]
    return []


@functools.lru_cache(maxsize=4096)
def _tokens_cached(source: str) -> tuple[tuple[str, int], ...]:
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return tuple(sorted(Counter(_code_string_tokens(source)).items()))
    docstrings = _docstring_ids(tree)
    counts: Counter[str] = Counter()
    for node in ast.walk(tree):
        counts.update(t for t in _node_tokens(node, docstrings) if len(t) >= MIN_TOKEN_CHARS)
    return tuple(sorted(counts.items()))


def code_tokens(source: str) -> Counter[str]:
    """Token counts of a candidate source (see the module docstring); never raises on bad syntax."""
    return Counter(dict(_tokens_cached(source)))


def _idf(documents: Sequence[Iterable[str]]) -> dict[str, float]:
    n = len(documents)
    df: Counter[str] = Counter()
    for doc in documents:
        df.update(set(doc))
    return {t: math.log((n + 1) / (c + 1)) + 1.0 for t, c in df.items()}


def _tfidf(counts: Counter[str], idf: dict[str, float], default_idf: float) -> dict[str, float]:
    return {t: (1.0 + math.log(c)) * idf.get(t, default_idf) for t, c in counts.items() if c > 0}


def _cosine(a: dict[str, float], b: dict[str, float]) -> float:
    if not a or not b:
        return 0.0
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    dot = sum(v * large.get(t, 0.0) for t, v in small.items())
    norm = math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values()))
    return dot / norm if norm else 0.0


def _weighted_jaccard(a: set[str], b: set[str], idf: dict[str, float], default_idf: float) -> float:
    union = a | b
    if not union:
        return 0.0
    weight = {r: idf.get(r, default_idf) for r in union}
    return sum(weight[r] for r in a & b) / sum(weight.values())


def rank_cases(source: str, cases: Sequence[HackCase], *, k: int = 3, rules: Iterable[str] | None = None,
               rule_weight: float = DEFAULT_RULE_WEIGHT) -> list[tuple[HackCase, float]]:
    """The `k` cases most similar to `source`, best first, with their scores (see the module docstring).

    `rules` are the static rules of `source` (computed when None). Cases with a zero score are left out.
    """
    if k <= 0 or not cases:
        return []
    query_rules = set(static_rules_of(source) if rules is None else rules)
    case_tokens = [code_tokens(c.source) for c in cases]
    idf = _idf(case_tokens)
    default_idf = math.log(len(cases) + 1) + 1.0  # a token no case has
    rule_idf = _idf([c.static_rules for c in cases])
    query_vec = _tfidf(code_tokens(source), idf, default_idf)
    scored = []
    for case, tokens in zip(cases, case_tokens, strict=True):
        score = _cosine(query_vec, _tfidf(tokens, idf, default_idf))
        score += rule_weight * _weighted_jaccard(query_rules, set(case.static_rules), rule_idf, default_idf)
        if score > 0:
            scored.append((case, score))
    scored.sort(key=lambda cs: (-cs[1], cs[0].id))
    return scored[:k]


def similar_cases(source: str, db: HackCaseDB | Sequence[HackCase], k: int = 3, *,
                  reference_source: str | None = None, rule_weight: float = DEFAULT_RULE_WEIGHT,
                  exclude_ids: Iterable[int] = ()) -> list[tuple[HackCase, float]]:
    """The `k` known hack cases most similar to `source`: `[(case, score), ...]`, best first.

    `db` is a `HackCaseDB` or a list of cases; `reference_source` sharpens the static rules of `source`
    (size and precision comparisons need it); `exclude_ids` leaves cases out (e.g. the candidate itself).
    """
    cases: list[Any] = db.list() if isinstance(db, HackCaseDB) else list(db)
    skip = set(exclude_ids)
    cases = [c for c in cases if c.id not in skip]
    return rank_cases(source, cases, k=k, rules=static_rules_of(source, reference_source),
                      rule_weight=rule_weight)
