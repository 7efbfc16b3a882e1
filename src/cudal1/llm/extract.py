"""Extract the candidate module (and the contrastive sections) from an LLM completion.

Rules, in order:
1. Reasoning is skipped: text up to the last `</think>` is dropped, and an unclosed `<think>` hides
   everything after it (if that leaves no code, the whole completion is searched instead).
2. Fenced blocks (``` or ~~~, any length >= 3) are found line by line; a block left open at the end
   (a truncated completion) runs to the end of the text.
3. Among blocks that define `class ModelNew`, the last one tagged python (python, py, python3) wins;
   else the last untagged one; else the last one with any other tag.
4. Else, among blocks holding a kernel-form spec (a JSON object, `core.forms.is_kernel_form`), the last one
   tagged json wins, else the last untagged one, else the last one with any other tag: the code is the spec's
   text (a malformed spec too: the evaluator names its bad field, more useful than "unparseable").
5. Without any fence, the whole completion is accepted when it parses as Python and defines ModelNew, or when it
   is a kernel-form spec (also when prose surrounds one JSON object from its first "{" to its last "}").
6. Otherwise `error` says why; the caller maps it to `Status.UNPARSEABLE`.

The three contrastive sections (`## Performance Analysis`, `## Algorithm Design`, `## Code`; any heading
level 1-4, case-insensitive, an optional trailing colon) are collected from text outside code blocks.

Limits: a code block containing a line that is itself a bare fence (e.g. a Markdown string inside the
code) ends the block early. The code is returned even if it does not parse (a truncated block): the
compile step reports the syntax error, which is more useful feedback than "unparseable".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cudal1.core.forms import is_kernel_form
from cudal1.core.syntax import parse as parse_python

SECTION_NAMES = ("Performance Analysis", "Algorithm Design", "Code")
PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})
JSON_TAGS = frozenset({"json", "jsonc", "json5"})

_FENCE = re.compile(r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<tag>[^\s`]*)[^`]*$")
_DEFINES_MODELNEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)
_HEADING = re.compile(r"^[ \t]*#{1,4}[ \t]*\**[ \t]*(?P<name>performance analysis|algorithm design|code)"
                      r"[ \t]*\**[ \t]*:?[ \t]*\**[ \t]*$", re.IGNORECASE)


@dataclass(frozen=True)
class Extraction:
    """The extracted code (None when none was found), the sections found, and why extraction failed."""

    code: str | None
    sections: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.code is not None


@dataclass(frozen=True)
class _Block:
    tag: str
    code: str
    start_line: int  # line index of the opening fence
    end_line: int  # line index of the closing fence (len(lines) when left open)
    closed: bool


def _find_blocks(lines: list[str]) -> list[_Block]:
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, tag = match.group("fence"), match.group("tag").lower()
        j = i + 1
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if close and not close.group("tag") and close.group("fence")[0] == fence[0] \
                    and len(close.group("fence")) >= len(fence):
                break
            j += 1
        blocks.append(_Block(tag, "\n".join(lines[i + 1:j]), i, j, j < len(lines)))
        i = j + 1
    return blocks


def _strip_reasoning(text: str) -> str:
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text


def _pick_block(blocks: list[_Block]) -> _Block | None:
    defining = [b for b in blocks if _DEFINES_MODELNEW.search(b.code)]
    specs = [b for b in blocks if not _DEFINES_MODELNEW.search(b.code) and is_kernel_form(b.code)]
    for found, tags in ((defining, PYTHON_TAGS), (specs, JSON_TAGS)):
        for wanted in (lambda b, tags=tags: b.tag in tags, lambda b: not b.tag, lambda b: True):
            chosen = [b for b in found if wanted(b)]
            if chosen:
                return chosen[-1]
    return None


def _unfenced_spec(text: str) -> str | None:
    """A kernel-form spec written without a fence: the whole text, or the one JSON object prose surrounds."""
    if is_kernel_form(text):
        return text
    first, last = text.find("{"), text.rfind("}")
    if 0 <= first < last and is_kernel_form(text[first:last + 1]):
        return text[first:last + 1]
    return None


def _parses(code: str) -> bool:
    try:
        parse_python(code)
    except (SyntaxError, ValueError):
        return False
    return True


def extract_sections(text: str) -> dict[str, str]:
    """The contrastive sections found outside code blocks: canonical name -> its text (code blocks kept)."""
    lines = text.splitlines()
    inside = set()
    for block in _find_blocks(lines):
        inside.update(range(block.start_line, min(block.end_line, len(lines) - 1) + 1))
    canonical = {name.lower(): name for name in SECTION_NAMES}
    starts: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        match = _HEADING.match(line) if i not in inside else None
        if match:
            starts.append((i, canonical[match.group("name").lower()]))
    sections: dict[str, str] = {}
    for k, (i, name) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(lines)
        sections[name] = "\n".join(lines[i + 1:end]).strip()
    return sections


def _extract_code(text: str) -> tuple[str | None, str | None]:
    """(code, error) from one text."""
    lines = text.splitlines()
    blocks = _find_blocks(lines)
    block = _pick_block(blocks)
    if block is not None:
        return block.code.strip("\n") + "\n", None
    if blocks:
        return None, (f"none of the {len(blocks)} code block(s) in the completion defines class ModelNew or holds "
                      "a kernel-form spec")
    stripped = text.strip()
    if stripped and _DEFINES_MODELNEW.search(stripped) and _parses(stripped):
        return stripped + "\n", None
    if _DEFINES_MODELNEW.search(stripped):
        return None, "the completion has no code block and does not parse as Python"
    spec = _unfenced_spec(stripped)
    if spec is not None:
        return spec + "\n", None
    return None, "no code block defining class ModelNew (nor a kernel-form spec) found in the completion"


def extract_completion(text: str) -> Extraction:
    """The candidate code and the contrastive sections of a completion (see the module docstring)."""
    if not text or not text.strip():
        return Extraction(code=None, error="the completion is empty")
    visible = _strip_reasoning(text)
    code, error = _extract_code(visible)
    if code is None and visible != text:
        code_all, _ = _extract_code(text)  # e.g. the code sat inside an unclosed <think>
        if code_all is not None:
            code, error = code_all, None
    sections = extract_sections(visible if visible.strip() else text)
    return Extraction(code=code, sections=sections, error=error)
