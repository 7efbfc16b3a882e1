"""A byte-level tokenizer that needs no files, for tests and tiny models.

Every UTF-8 byte is one token (ids 0-255); five special tokens follow (ids 256-260). The chat template is
ChatML-like (`<|im_start|>role\\ncontent<|im_end|>\\n`), and the end-of-turn token `<|im_end|>` is also the
EOS token, so generation stops at the end of the assistant turn exactly as with real chat models.

Limits: it is for tests and smoke runs (no compression: one token per byte). `save_pretrained` writes only
the tokenizer config; reload it with `ByteTokenizer.from_pretrained(path)` (or simply `ByteTokenizer()`),
since `AutoTokenizer` does not know this class.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizer

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|im_end|>"  # end of turn doubles as EOS so chat generation stops there
IM_START_TOKEN = "<|im_start|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, IM_START_TOKEN, UNK_TOKEN)
NUM_BYTES = 256

BYTE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_symbols() -> list[str]:
    """One printable, distinct character per byte value, so tokens are readable strings.

    Printable ASCII except space maps to itself; every other byte b maps to chr(256 + b), which is never
    whitespace or a control character, so the base tokenizer never strips or splits it.
    """
    return [chr(b) if 33 <= b <= 126 else chr(256 + b) for b in range(NUM_BYTES)]


class ByteTokenizer(PreTrainedTokenizer):
    """UTF-8 bytes as tokens plus `<|pad|>`, `<|bos|>`, `<|im_end|>` (EOS), `<|im_start|>`, `<|unk|>`."""

    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, **kwargs: Any):
        self._symbols = _byte_symbols()
        self._symbol_to_byte = {s: b for b, s in enumerate(self._symbols)}
        self._vocab = {s: b for b, s in enumerate(self._symbols)}
        for offset, token in enumerate(SPECIAL_TOKENS):
            self._vocab[token] = NUM_BYTES + offset
        self._id_to_token = {i: t for t, i in self._vocab.items()}
        kwargs.setdefault("pad_token", PAD_TOKEN)
        kwargs.setdefault("bos_token", BOS_TOKEN)
        kwargs.setdefault("eos_token", EOS_TOKEN)
        kwargs.setdefault("unk_token", UNK_TOKEN)
        kwargs.setdefault("extra_special_tokens", [IM_START_TOKEN])
        kwargs.setdefault("chat_template", BYTE_CHAT_TEMPLATE)
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        kwargs.setdefault("special_tokens_pattern", "none")
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        """Base vocabulary: 256 bytes plus the special tokens."""
        return NUM_BYTES + len(SPECIAL_TOKENS)

    def get_vocab(self) -> dict[str, int]:
        """Token string -> id, special tokens included."""
        return dict(self._vocab)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self._symbols[b] for b in text.encode("utf-8")]

    def _convert_token_to_id(self, token: str) -> int:
        return self._vocab.get(token, self._vocab[UNK_TOKEN])

    def _convert_id_to_token(self, index: int) -> str:
        return self._id_to_token.get(int(index), UNK_TOKEN)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Join byte tokens back into UTF-8 text; special tokens are kept verbatim."""
        parts: list[str] = []
        pending = bytearray()
        for token in tokens:
            byte = self._symbol_to_byte.get(token)
            if byte is not None:
                pending.append(byte)
                continue
            if pending:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending = bytearray()
            parts.append(token)
        if pending:
            parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        """Nothing to save: the vocabulary is fixed by construction."""
        return ()
