"""The file-free byte tokenizer: round trips, specials, chat template, padding, save/load."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from cudal1.llm.byte_tokenizer import EOS_TOKEN, NUM_BYTES, ByteTokenizer  # noqa: E402


def test_round_trip_utf8_and_whitespace():
    tok = ByteTokenizer()
    text = "héllo wörld\n\t  x = a // b  # ünïcode ✓"
    ids = tok(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_special_tokens_and_vocab():
    tok = ByteTokenizer()
    assert len(tok) == tok.vocab_size == NUM_BYTES + 5
    assert tok.eos_token == EOS_TOKEN and tok.eos_token_id >= NUM_BYTES
    assert tok.pad_token_id >= NUM_BYTES and tok.pad_token_id != tok.eos_token_id
    ids = tok("a<|im_end|>b")["input_ids"]
    assert ids == [97, tok.eos_token_id, 98]
    assert tok.decode(ids, skip_special_tokens=True) == "ab"


def test_chat_template_ends_with_generation_prompt():
    tok = ByteTokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.eos_token_id) == 1 and ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_left_padding_batch():
    tok = ByteTokenizer(padding_side="left")
    batch = tok(["a", "abc"], padding=True)
    assert batch["input_ids"][0] == [tok.pad_token_id, tok.pad_token_id, 97]
    assert batch["attention_mask"][0] == [0, 0, 1]


def test_save_and_reload(tmp_path):
    ByteTokenizer().save_pretrained(tmp_path)
    again = ByteTokenizer.from_pretrained(tmp_path)
    assert again("xyz")["input_ids"] == [120, 121, 122] and again.chat_template
