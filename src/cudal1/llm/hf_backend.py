"""Completions from a local Hugging Face `transformers` causal LM, batched with left padding.

The backend takes a path or hub id (`hf:PATH_OR_ID`, loaded with `AutoModelForCausalLM`/`AutoTokenizer`),
or an already-built `model` and `tokenizer` (the same objects a trainer updates, so sampling always uses
the current weights). Chats are rendered with the tokenizer's chat template when it has one, else as a
plain "role: content" join ending with "assistant:".

Limits: generation is synchronous (`agenerate` runs it in a worker thread); `concurrency` is the number
of prompts per batch; the model is switched to eval mode during generation and restored afterwards; the
tokenizer's padding side is set to left during generation and restored. A batch that raises (e.g. out of
memory) yields error completions for its prompts instead of an exception. A config `seed` seeds torch's
global RNG once, at the first generation; a per-call `seed=` reseeds it for that call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError, MissingDependencyError
from cudal1.core.hub import offline_if_unreachable
from cudal1.llm.backends import (
    BackendSpec,
    Completion,
    LLMConfig,
    Message,
    Prompt,
    UsageStats,
    as_messages,
    parse_own_spec,
    resolve_sampling,
)

logger = logging.getLogger(__name__)


def render_chat(tokenizer: Any, messages: list[Message]) -> tuple[str, bool]:
    """Prompt text for `messages`, and whether a chat template produced it (then it carries its own BOS)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return str(text), True
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n\n".join(lines) + "\n\nassistant:", False


class HFBackend:
    """`LLMBackend` over a local `transformers` model."""

    SPEC_FORM = "hf:PATH_OR_ID"

    @classmethod
    def parse_target(cls, spec: str, target: str) -> BackendSpec:
        """A local path or a hub id (the part of `spec` after 'hf:'); `ConfigError` when it is empty."""
        if not target.strip():
            raise ConfigError(f"bad LLM spec {spec!r}: expected {cls.SPEC_FORM!r}")
        return BackendSpec("hf", target.strip())

    def __init__(self, config: LLMConfig, *, model: Any = None, tokenizer: Any = None,
                 device: str | None = None):
        spec = parse_own_spec(type(self), config.spec)  # before any model is loaded
        self.config = config
        self.model = spec.model
        self.usage = UsageStats()
        self._seeded = False
        if model is None or tokenizer is None:
            model, tokenizer = _load(spec.model, model, tokenizer, device)
        self.hf_model = model
        self.tokenizer = tokenizer

    def generate(self, prompts: list[Prompt], n: int = 1, **sampling: Any) -> list[list[Completion]]:
        """`n` completions for each prompt, in prompt order, generated `concurrency` prompts at a time."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        params = resolve_sampling(self.config, sampling)
        if params["seed"] is not None and ("seed" in sampling or not self._seeded):
            import torch

            torch.manual_seed(int(params["seed"]))  # once per backend, or when a call passes seed=
            self._seeded = True
        results: list[list[Completion]] = []
        batch_size = self.config.concurrency
        for start in range(0, len(prompts), batch_size):
            batch = [as_messages(p) for p in prompts[start:start + batch_size]]
            t0 = time.monotonic()
            try:
                results.extend(self._generate_batch(batch, n, params))
            except Exception as exc:  # noqa: BLE001 - one failed batch must not lose the others
                logger.warning("HF generation failed for a batch of %d prompts", len(batch), exc_info=True)
                error = f"{type(exc).__name__}: {exc}"[:300]
                latency_s = time.monotonic() - t0
                for _ in batch:
                    self.usage.record(attempts=1, error=True)
                    results.append([Completion(text="", model=self.model, latency_s=latency_s, error=error)] * n)
        return results

    async def agenerate(self, prompts: list[Prompt], n: int = 1, **sampling: Any) -> list[list[Completion]]:
        """`generate` in a worker thread, so an event loop keeps running meanwhile."""
        return await asyncio.to_thread(self.generate, prompts, n, **sampling)

    def _generate_batch(self, batch: list[list[Message]], n: int, params: dict[str, Any]) -> list[list[Completion]]:
        import torch

        tok = self.tokenizer
        rendered = [render_chat(tok, messages) for messages in batch]
        templated = all(flag for _, flag in rendered)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        old_side, was_training = tok.padding_side, self.hf_model.training
        try:
            tok.padding_side = "left"  # generation appends on the right, so prompts must end aligned
            if tok.pad_token_id is None:
                tok.pad_token = tok.eos_token
            enc = tok([text for text, _ in rendered], return_tensors="pt", padding=True,
                      add_special_tokens=not templated)
            device = next(self.hf_model.parameters()).device
            input_ids = enc["input_ids"].to(device)  # (B, T)
            attention_mask = enc["attention_mask"].to(device)  # (B, T)
            greedy = params["temperature"] <= 0
            gen_kwargs: dict[str, Any] = {"max_new_tokens": int(params["max_tokens"]), "pad_token_id": pad_id,
                                          "eos_token_id": tok.eos_token_id, "do_sample": not greedy,
                                          # a checkpoint saved by a gradient-checkpointed run may say
                                          # use_cache=false: without the cache each token re-reads the prompt
                                          "use_cache": True}
            if self.config.batch_time_limit_s is not None:  # the batch returns what it has by then
                gen_kwargs["max_time"] = float(self.config.batch_time_limit_s)
            if not greedy:
                gen_kwargs.update(temperature=float(params["temperature"]), top_p=float(params["top_p"]),
                                  top_k=0, num_return_sequences=n)
            self.hf_model.eval()
            t0 = time.monotonic()
            with torch.no_grad():
                out = self.hf_model.generate(input_ids=input_ids, attention_mask=attention_mask, **gen_kwargs)
            latency_s = time.monotonic() - t0
        finally:
            tok.padding_side = old_side
            self.hf_model.train(was_training)
        new_tokens = out[:, input_ids.shape[1]:]  # (B * n, T_new) or (B, T_new) when greedy
        copies = 1 if greedy else n
        prompt_lengths = attention_mask.sum(dim=1).tolist()
        results = []
        for i in range(len(batch)):
            group = []
            for j in range(copies):
                group.append(self._completion(new_tokens[i * copies + j].tolist(), int(prompt_lengths[i]),
                                              latency_s))
            group = group * n if greedy else group  # greedy: n identical samples, generated once
            for c in group:
                self.usage.record(attempts=1, prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens)
            results.append(group)
        return results

    def _completion(self, ids: list[int], prompt_tokens: int, latency_s: float) -> Completion:
        """Cut at the first EOS (kept in the count), drop padding, decode without special tokens."""
        eos_ids = _as_id_set(self.tokenizer.eos_token_id) | _as_id_set(
            getattr(getattr(self.hf_model, "generation_config", None), "eos_token_id", None))
        finish = "length"
        for k, token in enumerate(ids):
            if token in eos_ids:
                ids, finish = ids[:k + 1], "stop"
                break
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=len(ids), finish_reason=finish,
                          model=self.model, latency_s=latency_s)


def _as_id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, (list, tuple, set)):
        return {int(v) for v in value}
    return {int(value)}


def unloadable_model_message(spec: str, exc: BaseException, offline: str | None = None) -> str:
    """One line on why `from_pretrained(spec)` failed, saying whether a local folder of that name exists
    (`offline`: why the hub could not be asked, from `core.hub.offline_if_unreachable`)."""
    if offline:
        return (f"cannot load model {spec!r}: no such local folder, not in the Hugging Face cache, and "
                f"{offline} (give a local folder, or load it once where the hub can be reached)")
    where = "" if Path(spec).exists() else " (no such local folder, and not a model id the hub could give)"
    why = " ".join(str(exc).split())  # the whole message on one line: its first line can stop mid-sentence
    return f"cannot load model {spec!r}{where}: {why[:300]}{'...' if len(why) > 300 else ''}"


def is_byte_tokenizer_dir(path: Path) -> bool:
    """Whether `path` holds a tokenizer saved by cudal1's `ByteTokenizer` (a `scratch` model's, as the
    training stages save it), which `AutoTokenizer` does not know."""
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("tokenizer_class") == "ByteTokenizer"
    except (OSError, ValueError):
        return False


def load_tokenizer(spec: str) -> Any:
    """A tokenizer from a path or hub id; `byte`, or a folder saved with the byte tokenizer, gives
    `ByteTokenizer`. The one loader of the training stages and of `hf:` generation, so a trained policy
    loads the same way in both."""
    if spec == "byte" or is_byte_tokenizer_dir(Path(spec)):
        from cudal1.llm.byte_tokenizer import ByteTokenizer

        return ByteTokenizer()
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("transformers", "train", "local model generation") from exc
    return transformers.AutoTokenizer.from_pretrained(spec)


def _load(path_or_id: str, model: Any, tokenizer: Any, device: str | None) -> tuple[Any, Any]:
    """Load what was not passed in from `path_or_id`."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("transformers", "train", "local model generation") from exc
    loads_model = model is None
    with offline_if_unreachable(path_or_id) as offline:
        try:
            if tokenizer is None:
                tokenizer = load_tokenizer(path_or_id)
            if loads_model:
                model = transformers.AutoModelForCausalLM.from_pretrained(path_or_id, dtype="auto")
        except (OSError, ValueError) as exc:  # ValueError: the hub's check of a repo id that is not one
            raise ConfigError(unloadable_model_message(path_or_id, exc, offline)) from None
    if loads_model:
        if device is not None:
            model = model.to(device)
        else:
            import torch

            if torch.cuda.is_available():
                model = model.to("cuda")
    return model, tokenizer
