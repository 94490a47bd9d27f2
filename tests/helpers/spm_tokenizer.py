"""A small tokenizer of the SentencePiece kind (what Llama-2, Mistral and Gemma ship as
tokenizer.json), trained in the test with the `tokenizers` library: "▁" for a space, ids 3..258
the byte-fallback tokens <0x00>..<0xFF> that spell any character the vocabulary lacks one UTF-8
byte at a time, and Llama-2's decoder chain (Replace "▁" -> " ", ByteFallback, Fuse, Strip the
leading space). The shipped tokenizer is the other kind, byte-level BPE."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
TRAINING_TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "def add(a, b):\n    return a + b",
    "speculative decoding drafts tokens on the edge and verifies them in the cloud",
    "a lossless system returns exactly what the target model would have produced",
    "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation , . ; : ! ? ( ) [ ] { }",
] * 4
# Characters the training text lacks: each is spelled by byte-fallback tokens, 2 to 4 of them.
MULTIBYTE_TEXT = "naïve café 中文 — ok 🙂 déjà vu Ω≈ 日本語 the end"


def _decoder() -> decoders.Decoder:
    return decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                              decoders.Strip(" ", 1, 0)])


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # Mistral's and the newer Llama tokenizer.json files: "▁" before the first word only.
    return pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)


def train_bpe() -> Tokenizer:
    """BPE with byte_fallback=True, specials at 0..2 and the byte tokens at 3..258 (Llama-2's ids)."""
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer_tok.train_from_iterator(TRAINING_TEXT, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    learnt = trainer_tok.get_vocab()
    vocab = {token: idx for idx, token in enumerate(SPECIALS + BYTE_TOKENS)}
    for token in sorted(learnt, key=learnt.get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
              for m in _merges(trainer_tok)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.pre_tokenizer, tok.decoder = _pre_tokenizer(), _decoder()
    tok.add_special_tokens(SPECIALS)
    return tok


def _merges(tok: Tokenizer) -> list:
    return json.loads(tok.to_str())["model"]["merges"]


def train_unigram() -> Tokenizer:
    """Unigram with byte_fallback=True, the byte tokens in the vocabulary (Gemma-like)."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer, tok.decoder = _pre_tokenizer(), _decoder()
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=SPECIALS + BYTE_TOKENS,
                                      unk_token="<unk>", show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    spec = json.loads(tok.to_str())
    spec["model"]["byte_fallback"] = True
    # The byte tokens are pieces of the model, not added tokens, so the model can fall back on them.
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in SPECIALS]
    return Tokenizer.from_str(json.dumps(spec))


def save(tok: Tokenizer, directory: Path) -> Path:
    """tokenizer.json + tokenizer_config.json that transformers' AutoTokenizer loads."""
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.save_pretrained(directory)
    return directory
