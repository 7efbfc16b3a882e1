"""How the study's policy reads and writes: a word-level vocabulary, the prompt, and the prompt styles.

A prompt is the task's features, then k scored recipes (worst first, as stage 3 shows them), then `=>`:

    row in1 heavy p3 fullout r16 c11 : T64 V1 I1 O S0 M0 0.63x ; T256 V4 I2 G S1 M0 2.2x ; =>

and the answer a recipe (`T512 V4 I4 G S1 M0`). Scores are shown on a fixed log grid (`SCORE_LEVELS`, 12 %
steps from 0.05x to 20x), one token each. The vocabulary (`VOCAB`) has one token per feature value, recipe
field value, score level and separator, about 160 in all; `make_tokenizer` builds it as a Hugging Face fast
tokenizer (`tokenizers`' WordLevel model), so TRL and transformers use it like any other. Prompts and answers
are plain strings (TRL's standard format; SFT appends the end-of-sequence token to answers).

Prompt styles (`STYLES`), each a stage-3 prompt builder over the exemplar database (`StudyPromptBuilder`):
`plain` (no exemplars), `bucket` (CUDA-L1's sampler), `random` (uniform), `shuffled` (the bucket sampler's
exemplars with their scores permuted among them, then shown in the order of the permuted scores: the code
text is kept, what the scores say about it is destroyed). Multi-turn refinement (`RefinePromptBuilder`)
shows instead the policy's own last attempts on the task with their measured results (`RefineHistory`), in
the same format, as Kevin-32B's and Dr.Kernel's multi-turn prompts show the last kernel and its feedback.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

from cudal1.exemplars import ScoredCode
from cudal1.train.rl import ContrastivePromptBuilder
from experimental.contrastive_study.recipes import FIELDS

SCORE_LEVELS = tuple(float(f"{10 ** (i / 20):.3g}") for i in range(-26, 27))
_LOG_LEVELS = [math.log(v) for v in SCORE_LEVELS]
SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")
SEPARATORS = (":", ";", "=>")
FEATURE_TOKENS = ("ew", "row", "tr", "in1", "in2", "heavy", "light", "p1", "p2", "p3", "rowout", "fullout",
                  *(f"r{i}" for i in range(32)), *(f"c{i}" for i in range(32)))
RECIPE_TOKENS = tuple(f"{name}{v}" if name not in ("L",) else str(v) for name, values in FIELDS.items()
                      for v in values)
VOCAB = (*SPECIAL, *SEPARATORS, *FEATURE_TOKENS, *RECIPE_TOKENS, *(f"{v:g}x" for v in SCORE_LEVELS))
STYLES = ("plain", "bucket", "random", "shuffled")
#: Messages' contents joined (the study's prompts are plain strings; this only gives chat callers the same text).
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"


def score_token(speedup: float) -> str:
    """The score level nearest to `speedup` (in log space), as its token."""
    x = math.log(min(max(speedup, SCORE_LEVELS[0]), SCORE_LEVELS[-1]))
    i = bisect.bisect_left(_LOG_LEVELS, x)
    if i > 0 and (i == len(_LOG_LEVELS) or x - _LOG_LEVELS[i - 1] < _LOG_LEVELS[i] - x):
        i -= 1
    return f"{SCORE_LEVELS[i]:g}x"


def prompt_text(features: Sequence[str], exemplars: Sequence[tuple[str, float]]) -> str:
    """The prompt for a task's features and (recipe, score) exemplars, in the order given."""
    shown = "".join(f" {recipe} {score_token(score)} ;" for recipe, score in exemplars)
    return f"{' '.join(features)} :{shown} =>"


def permuted(shown: Sequence[tuple[str, float]], rng: random.Random) -> list[tuple[str, float]]:
    """The same recipes with their scores permuted among them (never all left in place when they differ),
    shown in the order of the permuted scores."""
    scores = [s for _, s in shown]
    moved = list(scores)
    while moved == scores and len(set(scores)) > 1:
        rng.shuffle(moved)
    return sorted(((r, s) for (r, _), s in zip(shown, moved, strict=True)), key=lambda e: e[1])


def make_tokenizer() -> Any:
    """The study's word-level fast tokenizer (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", model_max_length=256)
    tok.chat_template = CHAT_TEMPLATE
    return tok


class StudyPromptBuilder(ContrastivePromptBuilder):
    """Stage 3's prompt builder with the study's rendering and prompt styles (module docstring). Exemplars
    are drawn exactly as stage 3 draws them (the project's samplers over the database as it is now)."""

    def __init__(self, db: Any, style: str, n: int, features: dict[str, list[str]], seed: int = 0):
        if style not in STYLES:
            raise ValueError(f"prompt style must be one of {STYLES}, not {style!r}")
        sampler = "random" if style == "random" else "bucket"
        super().__init__(db if style != "plain" else None, sampler=sampler, sampler_config={"n": n}, seed=seed)
        self.style = style
        self.features = features
        self._shuffle = random.Random(seed)

    def render(self, task: Any, exemplars: Sequence[Any]) -> str:  # type: ignore[override]
        shown = [(e.code, e.score) for e in exemplars]
        if self.style == "shuffled" and len(shown) > 1:
            scores = [s for _, s in shown]
            self._shuffle.shuffle(scores)
            shown = sorted(((code, s) for (code, _), s in zip(shown, scores, strict=True)), key=lambda e: e[1])
        return prompt_text(self.features[task.id], shown)


class RefineHistory:
    """Per trajectory (a task id, or any key), its last `turns` attempts (recipe, measured speedup)."""

    def __init__(self, turns: int = 2):
        if turns < 1:
            raise ValueError(f"turns must be >= 1, got {turns}")
        self.turns = turns
        self._attempts: dict[Hashable, deque[tuple[str, float]]] = {}

    def add(self, key: Hashable, recipe: str, speedup: float) -> None:
        self._attempts.setdefault(key, deque(maxlen=self.turns)).append((recipe, float(speedup)))

    def shown(self, key: Hashable) -> list[tuple[str, float]]:
        """The attempts a prompt shows, ascending by score as every study prompt shows its recipes."""
        return sorted(self._attempts.get(key, ()), key=lambda e: e[1])


class RefinePromptBuilder(ContrastivePromptBuilder):
    """Stage 3's prompt builder for multi-turn refinement: a task's prompt shows the policy's own last attempts
    on it and their measured results (the history a reward function fills), not the exemplar database."""

    def __init__(self, history: RefineHistory, features: dict[str, list[str]]):
        super().__init__(None, sampler="random", sampler_config={"n": 1})
        self.history = history
        self.features = features

    def exemplars(self, task: Any, step: int) -> list[Any]:
        return [ScoredCode(recipe, score) for recipe, score in self.history.shown(task.id)]

    def render(self, task: Any, exemplars: Sequence[Any]) -> str:  # type: ignore[override]
        return prompt_text(self.features[task.id], [(e.code, e.score) for e in exemplars])
