"""Policy models for training: load a checkpoint or build a small random model, LoRA and memory switches.

`load_policy(spec, tokenizer_spec)` returns `(model, tokenizer)`:
- a path or hub id: `AutoModelForCausalLM` + `AutoTokenizer` (a directory saved with cudal1's byte tokenizer
  is recognised from its `tokenizer_config.json` and reloaded as `ByteTokenizer`);
- `scratch[:hidden=H,layers=L,heads=A,kv_heads=K,intermediate=I,max_positions=P]`: a randomly initialised
  Llama sized by the options (defaults: a 2-layer, 32-wide toy for tests) with the byte tokenizer. It is the
  model the tests and the GPU end-to-end run train from scratch.

Chat templates: a tokenizer without one gets a ChatML-style template (logged), so SFT and GRPO always see
prompts rendered the same way as generation does (`HFBackend.render_chat`).

Limits: quantized loading (bitsandbytes) is not wired; multi-GPU sharding is left to accelerate/TRL.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError, MissingDependencyError
from cudal1.core.hub import offline_if_unreachable
from cudal1.llm.hf_backend import load_tokenizer, unloadable_model_message

logger = logging.getLogger(__name__)

SCRATCH_DEFAULTS = {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 0, "intermediate": 0, "max_positions": 8192}

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def require_transformers() -> Any:
    """Import transformers or raise `MissingDependencyError` naming the `train` extra."""
    try:
        import transformers
    except ImportError:
        raise MissingDependencyError("transformers", "train", "training") from None
    return transformers


def parse_scratch_spec(spec: str) -> dict[str, int]:
    """'scratch:hidden=64,layers=4' -> sizes (defaults filled in); `ConfigError` on unknown keys."""
    sizes = dict(SCRATCH_DEFAULTS)
    _, _, opts = spec.partition(":")
    for item in filter(None, (o.strip() for o in opts.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in sizes:
            raise ConfigError(f"bad scratch model option {item!r}; known: {', '.join(sizes)}")
        try:
            sizes[key] = int(value)
        except ValueError:
            raise ConfigError(f"scratch model option {key} must be an integer, got {value!r}") from None
    if sizes["hidden"] % sizes["heads"] != 0:
        raise ConfigError(f"scratch model: hidden ({sizes['hidden']}) must be divisible by heads ({sizes['heads']})")
    return sizes


def build_scratch_model(spec: str, seed: int = 0) -> tuple[Any, Any]:
    """A randomly initialised Llama and the byte tokenizer (see the module docstring)."""
    transformers = require_transformers()
    import torch

    from cudal1.llm.byte_tokenizer import ByteTokenizer

    sizes = parse_scratch_spec(spec)
    tok = ByteTokenizer()
    config = transformers.LlamaConfig(
        hidden_size=sizes["hidden"], intermediate_size=sizes["intermediate"] or 2 * sizes["hidden"],
        num_hidden_layers=sizes["layers"], num_attention_heads=sizes["heads"],
        num_key_value_heads=sizes["kv_heads"] or sizes["heads"], vocab_size=len(tok),
        max_position_embeddings=sizes["max_positions"], pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    return model, tok


def ensure_chat_template(tokenizer: Any) -> Any:
    """Give a tokenizer without a chat template a ChatML one; make sure it has a pad token."""
    if not getattr(tokenizer, "chat_template", None):
        logger.warning("tokenizer has no chat template; using a ChatML-style one")
        tokenizer.chat_template = CHATML_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(spec: str, tokenizer_spec: str = "", *, seed: int = 0, dtype: str = "auto") -> tuple[Any, Any]:
    """(model, tokenizer) for a model spec: a path, a hub id or 'scratch[:...]'."""
    if spec == "scratch" or spec.startswith("scratch:"):
        model, tok = build_scratch_model(spec, seed=seed)
        if tokenizer_spec and tokenizer_spec != "byte":
            raise ConfigError("a scratch model uses the byte tokenizer; leave tokenizer empty or 'byte'")
        return model, ensure_chat_template(tok)
    transformers = require_transformers()
    with offline_if_unreachable(spec) as offline:  # an unknown hub id offline fails in seconds
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
            tok = load_tokenizer(tokenizer_spec or spec)
        except (OSError, ValueError) as exc:  # ValueError: the hub's check of a repo id that is not one
            raise ConfigError(unloadable_model_message(spec, exc, offline)) from None
    return model, ensure_chat_template(tok)


def save_policy(model: Any, tokenizer: Any, path: str | Path) -> Path:
    """Save model and tokenizer to `path`; returns `path`.

    A LoRA model (peft) is saved merged into its base weights, a plain model that the next stage, sampling
    and vLLM load like any other, so that no stage's adapters are dropped on the way (a bare adapter needs its
    base to be found again, which a scratch or in-memory base cannot be); the adapter alone goes to
    `path/adapter` too. Merging changes `model` in place: call this when the stage is done with it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        model.save_pretrained(path / "adapter")
        model = model.merge_and_unload()
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", None) is False:
        # Training with gradient checkpointing turns the KV cache off; a saved policy is for sampling.
        config.use_cache = True
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_trained(trainer: Any, tokenizer: Any, path: str | Path) -> Path:
    """The policy a (TRL/transformers) trainer trained, saved once for the whole run; returns `path`.

    Under DeepSpeed ZeRO-3 the weights are partitioned across the ranks: every rank calls the trainer's
    `save_model`, which gathers them and writes on the main process (a LoRA policy then saves its adapter,
    unmerged: merging needs the whole base model on one rank). Otherwise the main process saves with
    `save_policy` (LoRA merged) while the others wait."""
    path = Path(path)
    accelerator = trainer.accelerator
    if zero3(trainer):
        trainer.save_model(str(path))
        if accelerator.is_main_process:
            tokenizer.save_pretrained(path)
    elif accelerator.is_main_process:
        save_policy(trainer.model, tokenizer, path)
    accelerator.wait_for_everyone()
    return path


def zero3(trainer: Any) -> bool:
    """Whether `trainer` runs under DeepSpeed ZeRO stage 3."""
    plugin = getattr(getattr(trainer.accelerator, "state", None), "deepspeed_plugin", None)
    return bool(getattr(trainer, "is_deepspeed_enabled", False) and plugin is not None
                and getattr(plugin, "zero_stage", 0) == 3)


def lora_config(config: Any) -> Any:
    """A peft `LoraConfig` for a stage config with `use_lora`, else None."""
    if not config.use_lora:
        return None
    try:
        import peft
    except ImportError:
        raise MissingDependencyError("peft", "train", "LoRA training") from None
    targets = config.lora_target_modules
    target = targets[0] if len(targets) == 1 and targets[0] == "all-linear" else list(targets)
    return peft.LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                           target_modules=target, task_type="CAUSAL_LM")
