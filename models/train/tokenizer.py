"""Train the family's byte-level BPE tokenizer on the training split of the corpus.

Usage: python -m models.train.tokenizer --out models/tokenizer
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from models.train.corpus import corpus_files, split

VOCAB_SIZE = 4096
EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # ByteLevel with the GPT-2 regex: llama.cpp reproduces it as pre-tokenizer "gpt-2".
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def as_hf(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=None,
        pad_token=EOS_TOKEN,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("models/tokenizer"))
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args()
    train_files, heldout_files = split(corpus_files())
    tok = train_tokenizer([f.read() for f in train_files], args.vocab_size)
    as_hf(tok).save_pretrained(str(args.out))
    print(f"tokenizer: {tok.get_vocab_size()} ids, trained on {len(train_files)} files "
          f"({len(heldout_files)} held out) -> {args.out}")


if __name__ == "__main__":
    main()
