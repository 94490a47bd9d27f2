"""Tokenizers of the other kind: SentencePiece-style vocabularies with byte fallback (Llama-2,
Mistral, Gemma), built and trained here with the `tokenizers` library (BPE and Unigram models),
beside the shipped byte-level BPE one.

* The daemon's streamed text (edge/daemon/output.py TextOutput over the detokenizer) equals
  `decode` of all tokens, however the ids are chunked, and a character spelled by several
  byte-fallback tokens is never released broken: no U+FFFD in the stream that the full decode
  does not have at that place.
* The tokenizer fingerprint tells the kinds apart, even for the same token strings, and the
  shipped tokenizer's fingerprint (the key of tandem/qpriors/<fingerprint>.npy) has not moved."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from spm_tokenizer import BYTE_TOKENS, MULTIBYTE_TEXT, TRAINING_TEXT, save, train_bpe, train_unigram
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer

from edge.daemon.detokenizer import IncrementalDetokenizer, NativeDetokenizer, make_detokenizer
from edge.daemon.output import TextOutput
from edge.link_state import LinkState
from edge.runtime.vocab import tokenizer_json_fingerprint
from edge.tokenizer import EdgeTokenizer
from tandem.fingerprint import (BYTE_LEVEL, SENTENCEPIECE, tokenizer_fingerprint, tokenizer_json_kind,
                                vocab_fingerprint)

pytestmark = pytest.mark.unit  # tokenizers only, no model, no server

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "tokenizer"
QPRIORS = ROOT / "tandem" / "qpriors"
REPLACEMENT = "\ufffd"
TEXTS = [MULTIBYTE_TEXT, "🙂" * 6, "é中" * 5 + " fox", "\n".join(TRAINING_TEXT[:3]), "  two  spaces ",
         "x = 'Grüße, мир, 世界'\n"]


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def spm_dir(request, tmp_path_factory) -> Path:
    train = {"bpe": train_bpe, "unigram": train_unigram}[request.param]
    return save(train(), tmp_path_factory.mktemp(request.param))


def stream(tokenizer: EdgeTokenizer, ids: list[int], sizes: list[int]) -> list[str]:
    """The deltas the daemon releases for ids committed in chunks of `sizes` (no stop strings)."""
    deltas: list[str] = []
    output = TextOutput(tokenizer, stop_strings=[], stop_ids=frozenset(), timeout_s=60.0,
                        on_text=lambda d: deltas.append(d.text), link_state=lambda: LinkState.UP,
                        arrived_s=time.monotonic())
    start = 0
    for n in sizes:
        assert output.push(ids[start:start + n], [True] * n)
        start += n
    output.finish()
    return deltas


def chunkings(rng: random.Random, n: int) -> list[list[int]]:
    """One token at a time, everything at once, and random chunks of 1-5."""
    chunks = [[1] * n, [n]]
    for _ in range(3):
        sizes, left = [], n
        while left:
            sizes.append(min(rng.randint(1, 5), left))
            left -= sizes[-1]
        chunks.append(sizes)
    return chunks


def test_the_tokenizers_are_of_the_sentencepiece_kind(spm_dir):
    tok = Tokenizer.from_file(str(spm_dir / "tokenizer.json"))
    ids = tok.encode(MULTIBYTE_TEXT, add_special_tokens=False).ids
    pieces = [tok.id_to_token(i) for i in ids]
    assert sum(p in BYTE_TOKENS for p in pieces) >= 20, pieces  # 中, 🙂, Ω... by their bytes
    assert "<unk>" not in pieces and any(p.startswith("▁") for p in pieces)
    assert tok.decode(ids) == MULTIBYTE_TEXT  # byte fallback is lossless
    assert tokenizer_json_kind(json.loads(tok.to_str())) == SENTENCEPIECE


def test_streamed_text_equals_decode_and_never_breaks_a_character(spm_dir):
    tokenizer = EdgeTokenizer(spm_dir)
    rng = random.Random(0)
    cases = [tokenizer.encode(t) for t in TEXTS]
    # Random ids: byte tokens in orders that are not UTF-8, mid-character starts and ends.
    cases += [[rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 40))]
              for _ in range(50)]
    for ids in cases:
        whole = tokenizer.decode(ids)
        for sizes in chunkings(rng, len(ids)):
            deltas = stream(tokenizer, ids, sizes)
            assert "".join(deltas) == whole, (ids, sizes)
            so_far = ""
            for delta in deltas:
                so_far += delta
                # What was released is final: a prefix of the full decode, so a U+FFFD in it is
                # one that the full decode has there too (a truly invalid byte), never a half
                # character that a later token would have completed.
                assert whole.startswith(so_far), (ids, sizes, so_far)
            if REPLACEMENT not in whole:
                assert all(REPLACEMENT not in d for d in deltas)


def test_a_byte_run_is_released_only_once_closed(spm_dir):
    """ByteFallback decodes a run of byte tokens as a whole: "<0x48>" alone is "H", but followed
    by an invalid byte the run is "��". The stream holds a run back until a non-byte token
    closes it (tokenizers' own DecodeStream raises there, so the daemon does not use it for
    this kind; the byte-level kind keeps it)."""
    tokenizer = EdgeTokenizer(spm_dir)
    vocab = tokenizer.hf_tokenizer.get_vocab()
    fox = tokenizer.encode(" fox")
    ids = [vocab["<0x48>"], vocab["<0x9B>"], *fox]
    assert tokenizer.decode(ids[:1]) == "H" and tokenizer.decode(ids) == REPLACEMENT * 2 + " fox"
    detok = make_detokenizer(tokenizer)
    assert isinstance(detok, IncrementalDetokenizer)
    pieces = [detok.push([i]) for i in ids] + [detok.flush()]
    assert pieces[:2] == ["", ""] and pieces[2].startswith(REPLACEMENT * 2)  # never "H" first
    assert "".join(pieces) == tokenizer.decode(ids)

    native = DecodeStream(skip_special_tokens=False)
    with pytest.raises(Exception, match="Invalid prefix"):
        for i in ids:
            native.step(tokenizer.hf_tokenizer, i)
    assert isinstance(make_detokenizer(EdgeTokenizer(SHIPPED)), NativeDetokenizer)


def test_fingerprint_tells_the_kinds_apart(spm_dir, tmp_path):
    spm = AutoTokenizer.from_pretrained(spm_dir)
    shipped = AutoTokenizer.from_pretrained(SHIPPED)
    assert tokenizer_fingerprint(spm) != tokenizer_fingerprint(shipped)
    # The edge (tokenizer.json) and the verifier (transformers) compute the same fingerprint.
    assert tokenizer_json_fingerprint(spm_dir) == tokenizer_fingerprint(spm)
    assert tokenizer_fingerprint(spm) != vocab_fingerprint(spm.get_vocab())  # the kind is in it

    # The same token strings and ids with a byte-level pipeline read the ids as other text:
    # only the kind tells them apart.
    spec = json.loads((spm_dir / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": True}
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                       "use_regex": True}
    spec["model"]["byte_fallback"] = False
    other = Tokenizer.from_str(json.dumps(spec))
    assert other.get_vocab() == Tokenizer.from_file(str(spm_dir / "tokenizer.json")).get_vocab()
    assert tokenizer_json_kind(spec) == BYTE_LEVEL
    assert tokenizer_fingerprint(other) != tokenizer_json_fingerprint(spm_dir)


def test_shipped_fingerprint_has_not_moved():
    """tandem/qpriors/<fingerprint>.npy is keyed by it: a byte-level tokenizer hashes as its
    vocabulary alone, as before the kind was hashed."""
    shipped = AutoTokenizer.from_pretrained(SHIPPED)
    fingerprint = tokenizer_fingerprint(shipped)
    assert fingerprint == "sha256:a4d321229c99f72f2c3dc7f857405145"
    assert (QPRIORS / f"{fingerprint.removeprefix('sha256:')}.npy").is_file()
    assert fingerprint == vocab_fingerprint(shipped.get_vocab()) == tokenizer_json_fingerprint(SHIPPED)
    for model in ("tandem-draft", "tandem-target", "tandem-small"):
        assert tokenizer_json_fingerprint(ROOT / "models" / model) == fingerprint
