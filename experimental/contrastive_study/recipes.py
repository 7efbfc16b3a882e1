"""The recipe grammar of the contrastive study: six fields that a template turns into a CUDA kernel.

A recipe is written `T256 V4 I2 G S0 M1`:

| field | values | meaning |
|---|---|---|
| `T` | 64 128 256 512 1024 | threads per block |
| `V` | 1 2 4 | floats per global load (float, float2, float4) |
| `I` | 1 2 4 8 | items per thread per iteration: vectors a thread loads before it uses any (memory-level parallelism), or tiles per block (transposes) |
| `O`/`G` | | one-shot (the grid covers the data once) or grid-stride (one resident wave of blocks loops over it) |
| `S` | 0 1 | shared-memory staging: elementwise ops stage a block's chunk, row ops keep the row for later passes, transposes go through 32-row tiles |
| `M` | 0 1 | the work mapping, read by the op's kind: elementwise, interleaved (neighbouring threads take neighbouring vectors) or a contiguous run per thread; row ops, a warp or a block per row; transposes without staging, reads or writes coalesced; with staging, a padded tile or an unpadded one (bank conflicts) |

5 x 3 x 4 x 2 x 2 x 2 = 480 recipes. Some cannot run on a given task (a staged chunk or row larger than the
shared memory a block may have); the table records them as failures, as the evaluator would.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

THREADS = (64, 128, 256, 512, 1024)
VECTOR = (1, 2, 4)
ITEMS = (1, 2, 4, 8)
LOOPS = ("O", "G")
STAGES = (0, 1)
MAPS = (0, 1)
#: The fields in order, each with its values (the tokens of the study's vocabulary are built from these).
FIELDS = {"T": THREADS, "V": VECTOR, "I": ITEMS, "L": LOOPS, "S": STAGES, "M": MAPS}

_RECIPE = re.compile(r"T(\d+)\s+V(\d+)\s+I(\d+)\s+([OG])\s+S(\d)\s+M(\d)")


@dataclass(frozen=True, order=True)
class Recipe:
    threads: int
    vec: int
    items: int
    loop: str  # "O" one-shot, "G" grid-stride
    stage: int
    mapping: int

    @property
    def text(self) -> str:
        return f"T{self.threads} V{self.vec} I{self.items} {self.loop} S{self.stage} M{self.mapping}"

    @property
    def tokens(self) -> list[str]:
        """The recipe as the study's tokens, one per field."""
        return self.text.split()

    @property
    def grid_stride(self) -> bool:
        return self.loop == "G"

    def __str__(self) -> str:
        return self.text


SPACE: tuple[Recipe, ...] = tuple(Recipe(*v) for v in itertools.product(THREADS, VECTOR, ITEMS, LOOPS, STAGES, MAPS))
BY_TEXT: dict[str, Recipe] = {r.text: r for r in SPACE}


def parse_recipe(text: str | None) -> str | None:
    """The canonical text of the first recipe in `text` that lies in the space, else None (unparseable)."""
    match = _RECIPE.search(text or "")
    if not match:
        return None
    recipe = Recipe(int(match[1]), int(match[2]), int(match[3]), match[4], int(match[5]), int(match[6]))
    return recipe.text if recipe.text in BY_TEXT else None


def field_values(recipe: Recipe) -> tuple:
    """The recipe's value of each field, in `FIELDS` order."""
    return (recipe.threads, recipe.vec, recipe.items, recipe.loop, recipe.stage, recipe.mapping)


def distance(a: Recipe, b: Recipe) -> int:
    """How many fields two recipes differ in (0-6)."""
    return sum(x != y for x, y in zip(field_values(a), field_values(b), strict=True))
