"""Entropy-coded draft distributions: one range-coded byte string carries the q of every
position of a block (Draft.q_coded), about a third of the bytes of the plain SparseDistribution
messages at the same acceptance.

The quantizer (`QCodec.quantize`, on the edge, before the draft token is sampled):
  the top `max_entries` ids (at most CAP = 24) of the warped draft probabilities; each gets a
  level l = round(3 ln(q_max / q)), i.e. third-of-a-nat steps below the most likely id, and ids
  with l > MAX_LEVEL (below e^-3 ~ 5% of the top) are dropped. The weight of an id is
  WEIGHTS[l], a fixed integer table, so q(id) = WEIGHTS[l] / sum. The draft samples from exactly
  this SparseDist, and the coder below reproduces it bit for bit: the verifier tests the very q
  the token was drawn from (lossless). The flat tail the plain 16 entries carried costs more
  bytes than acceptance; more candidates with a cut relative to the top buy acceptance back.

The format of a block of k positions (tokens x_1..x_k travel in Draft.tokens, so both ends
know them before q is decoded). For each position i, in order, with constriction's range
coder (queue: first in, first out) and categorical models both ends build from what they hold:
  n_i - 1            the number of entries, model COUNT_FREQS over 1..CAP
  l_2 - l_1, ...     the n_i - 1 level steps (levels are non-decreasing; l_1 = 0), model
                     STEP_FREQS over 0..MAX_LEVEL; their sum stays <= MAX_LEVEL
  index of x_i       where the drafted token sits in the list, modelled by q_i itself (the
                     weights just decoded): it costs -log2 q_i(x_i) bits (none when n_i = 1)
  the other ids      n_i - 1 ids in list order, model: the id prior (below)
The compressed 32-bit words are sent little-endian. A payload is valid only if it is exactly
the encoding of what it decodes to (the decoder re-encodes and compares), so truncated,
padded or corrupted bytes are refused, never silently read as some other q.

The id prior is a table of counts over the vocabulary, shipped in tandem/qpriors/ keyed by the
tokenizer fingerprint (models/train/q_prior.py builds it: how often each id is kept in a
draft q on the training split); a tokenizer without one gets a uniform prior. The codec's name,
negotiated in Open.q_codecs / Opened.q_codec, carries a digest of the prior and constriction's
version, so two ends only agree on the coded format when they build the same models;
otherwise the plain SparseDistribution messages are used.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tandem.codec import InvalidDistribution, SparseDist
from tandem.codec_defaults import DEFAULT_CODED_ENTRIES

try:  # the coder; without it only the plain encoding is offered
    import constriction
    # Both ends must quantize the models alike: the coder's version is part of the name.
    CODER_VERSION = importlib.metadata.version("constriction")
except ImportError:  # pragma: no cover - constriction is a declared dependency
    constriction, CODER_VERSION = None, ""

CODEC_FAMILY = "ans1"
CAP = DEFAULT_CODED_ENTRIES  # most entries per position (24)
LEVELS_PER_NAT = 3
MAX_LEVEL = 9            # levels kept below the top: e^-3 of its probability
# round(1023 * exp(-l / 3)) for l = 0..MAX_LEVEL, fixed here so no libm decides a weight.
WEIGHTS = (1023, 733, 525, 376, 270, 193, 138, 99, 71, 51)
# Static models (counts + 1; only their ratios matter) of the entries per position (1..CAP)
# and the level steps (0..MAX_LEVEL): the shipped draft on the training split, printed by
# models/train/q_prior.py.
COUNT_FREQS = (29372, 17601, 14426, 11592, 9682, 8438, 7309, 6256, 5679, 5065, 4427, 3799, 3341,
               3218, 2803, 3198, 2521, 2206, 2107, 1891, 1757, 1675, 1526, 50327)
STEP_FREQS = (1249505, 520129, 109965, 50999, 29094, 18317, 12223, 8231, 6050, 4329)
# A position codes at most 1 + 23 + 1 + 23 symbols of at most 24 bits each (constriction's
# precision): a payload above this many bytes per token (plus one for the flush) is not a q.
MAX_CODED_BYTES_PER_TOKEN = 144
PRIORS_DIR = Path(__file__).resolve().parent / "qpriors"

_LEVEL_OF = np.full(WEIGHTS[0] + 1, -1, dtype=np.int32)  # weight -> level, -1 off the grid
_LEVEL_OF[list(WEIGHTS)] = np.arange(len(WEIGHTS), dtype=np.int32)


def _probabilities(freqs: Sequence[int] | np.ndarray) -> np.ndarray:
    """Integer frequencies -> float64 probabilities; integer sum and one correctly rounded
    division each, so both ends get the same floats (and constriction the same model)."""
    counts = np.asarray(freqs, dtype=np.int64)
    return counts.astype(np.float64) / float(int(counts.sum()))


@dataclass(frozen=True, eq=False)
class IdPrior:
    """Counts over the vocabulary: [vocab] int64, all > 0."""
    counts: np.ndarray
    source: str = "uniform"

    @property
    def vocab_size(self) -> int:
        return len(self.counts)

    @functools.cached_property
    def digest(self) -> str:
        return hashlib.sha256(self.counts.astype("<u4").tobytes()).hexdigest()[:16]

    @functools.cached_property
    def model(self):
        return constriction.stream.model.Categorical(_probabilities(self.counts), perfect=False)


def uniform_prior(vocab_size: int) -> IdPrior:
    return IdPrior(counts=np.ones(vocab_size, dtype=np.int64), source="uniform")


def prior_path(fingerprint: str) -> Path:
    return PRIORS_DIR / f"{fingerprint.removeprefix('sha256:')}.npy"


@functools.lru_cache(maxsize=8)
def load_prior(fingerprint: str, vocab_size: int) -> IdPrior:
    """The shipped prior of this tokenizer (its counts + 1, over the tokenizer's vocabulary
    whatever a model pads its own to), or a uniform one over vocab_size when none is shipped."""
    path = prior_path(fingerprint)
    if not path.is_file():
        return uniform_prior(vocab_size)
    return IdPrior(counts=np.load(path).astype(np.int64) + 1, source=path.name)


@dataclass(frozen=True)
class QCodec:
    """The entropy-coded q of one session (both ends build it from the same prior)."""
    prior: IdPrior
    _count_model: object = field(init=False, repr=False, compare=False)
    _step_model: object = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        model = constriction.stream.model.Categorical
        object.__setattr__(self, "_count_model", model(_probabilities(COUNT_FREQS), perfect=False))
        object.__setattr__(self, "_step_model", model(_probabilities(STEP_FREQS), perfect=False))

    @property
    def name(self) -> str:
        """What Open.q_codecs and Opened.q_codec carry: the format, the prior's digest and
        the coder's version (its fixed-point models must be the same at both ends)."""
        return f"{CODEC_FAMILY}:{self.prior.vocab_size}:{self.prior.digest}:c{CODER_VERSION}"

    # ---- the quantizer (edge) ------------------------------------------------------------
    def quantize(self, probs: torch.Tensor, max_entries: int = CAP) -> SparseDist:
        """probs: [vocab] -> a SparseDist on the level grid (at most min(max_entries, CAP)
        entries, weights from WEIGHTS, non-increasing), which `encode` codes exactly."""
        if probs.dim() != 1:
            raise ValueError(f"expected [vocab] probabilities, got shape {tuple(probs.shape)}")
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()) or \
                not probs.sum() > 0:
            raise InvalidDistribution("probabilities must be finite, non-negative and not all zero")
        m = max(1, min(max_entries, CAP, probs.shape[0]))
        top = torch.topk(probs.double(), m)
        ratio = (top.values / top.values[0]).clamp_min(1e-300)            # [m], first is 1
        levels = torch.round(-LEVELS_PER_NAT * torch.log(ratio)).long()   # [m] non-decreasing
        keep = (levels <= MAX_LEVEL) & (top.values > 0)
        keep[0] = True
        table = torch.tensor(WEIGHTS, dtype=torch.long)
        return SparseDist(ids=top.indices[keep].numpy().astype(np.int64),
                          weights=table[levels[keep]].numpy().astype(np.int64))

    def levels(self, dist: SparseDist) -> np.ndarray:
        """[n] int32 levels of a q on this codec's grid (what `quantize` makes: 1..CAP distinct
        ids of the prior's vocabulary, weights from WEIGHTS, non-increasing, the first
        WEIGHTS[0]); raises InvalidDistribution for any other q."""
        ids, weights = dist.ids, dist.weights
        n = len(ids)
        if not 1 <= n <= CAP or len(weights) != n or weights.min() < 0 or \
                weights.max() > WEIGHTS[0]:
            raise InvalidDistribution("q is not on the coded grid (QCodec.quantize)")
        levels = _LEVEL_OF[weights]
        if levels[0] != 0 or levels.min() < 0 or (n > 1 and (levels[1:] < levels[:-1]).any()) or \
                ids.min() < 0 or ids.max() >= self.prior.vocab_size or len(set(ids.tolist())) != n:
            raise InvalidDistribution("q is not on the coded grid (QCodec.quantize)")
        return levels

    def encodable(self, dist: SparseDist) -> bool:
        """Whether `dist` is on this codec's grid (what `quantize` makes), so it can be coded."""
        try:
            self.levels(dist)
        except InvalidDistribution:
            return False
        return True

    # ---- the coder (both ends) -----------------------------------------------------------
    def encode(self, tokens: Sequence[int], q: Sequence[SparseDist]) -> bytes:
        """A block's q (one per token, each on the grid, each listing its token) -> bytes.
        Raises InvalidDistribution for a q off the grid or without its token."""
        if len(tokens) != len(q):
            raise ValueError(f"{len(tokens)} tokens but {len(q)} distributions")
        return self._encode(tokens, q, [self.levels(dist) for dist in q])

    def _encode(self, tokens: Sequence[int], q: Sequence[SparseDist],
                levels: Sequence[np.ndarray]) -> bytes:
        encoder = constriction.stream.queue.RangeEncoder()
        for token, dist, lv in zip(tokens, q, levels):
            hit = np.nonzero(dist.ids == token)[0]
            if len(hit) == 0:
                raise InvalidDistribution(f"draft token {token} is not among q's ids")
            n, index = len(dist.ids), int(hit[0])
            encoder.encode(n - 1, self._count_model)
            if n > 1:  # one entry: no steps, and the index is 0
                encoder.encode(lv[1:] - lv[:-1], self._step_model)
                encoder.encode(index, _weight_model(lv.tobytes()))
                encoder.encode(np.concatenate((dist.ids[:index], dist.ids[index + 1:])).astype(np.int32),
                               self.prior.model)
        return encoder.get_compressed().astype("<u4").tobytes()

    def decode(self, data: bytes, tokens: Sequence[int]) -> list[SparseDist]:
        """bytes + the block's tokens -> one SparseDist per token. Raises InvalidDistribution
        on anything that is not exactly the encoding of such a block."""
        if len(data) % 4:
            raise InvalidDistribution(f"coded q of {len(data)} bytes: not whole 32-bit words")
        words = np.frombuffer(data, dtype="<u4").astype(np.uint32)
        try:
            q = self._decode_words(words, tokens)
        except InvalidDistribution:
            raise
        except (ValueError, TypeError, OverflowError, RuntimeError, AssertionError) as exc:
            # constriction reports data its model cannot decode with an AssertionError.
            raise InvalidDistribution(f"undecodable coded q: {exc}") from None
        if self._encode(tokens, q, [_LEVEL_OF[dist.weights] for dist in q]) != data:
            raise InvalidDistribution("coded q has trailing, missing or non-canonical bytes")
        return q

    def _decode_words(self, words: np.ndarray, tokens: Sequence[int]) -> list[SparseDist]:
        decoder = constriction.stream.queue.RangeDecoder(words)
        out = []
        for i, token in enumerate(tokens):
            token = int(token)
            if not 0 <= token < self.prior.vocab_size:
                raise InvalidDistribution(f"token {token} at block position {i} is outside the "
                                          f"coded vocabulary ({self.prior.vocab_size})")
            n = int(decoder.decode(self._count_model)) + 1
            levels = np.zeros(n, dtype=np.int32)
            if n > 1:
                levels[1:] = np.cumsum(decoder.decode(self._step_model, n - 1))
                if levels[-1] > MAX_LEVEL:
                    raise InvalidDistribution(f"q at block position {i}: level {levels[-1]} is "
                                              f"above {MAX_LEVEL}")
            index = int(decoder.decode(_weight_model(levels.tobytes()))) if n > 1 else 0
            others = (decoder.decode(self.prior.model, n - 1).astype(np.int64) if n > 1
                      else np.zeros(0, dtype=np.int64))
            ids = np.concatenate((others[:index], [token], others[index:]))
            if len(set(ids.tolist())) != n:
                raise InvalidDistribution(f"q at block position {i}: repeated token id")
            weights = np.array(WEIGHTS, dtype=np.int64)[levels]
            out.append(SparseDist(ids=ids, weights=weights))
        return out


@functools.lru_cache(maxsize=4096)
def _weight_model(levels: bytes):
    """The categorical over list positions with q's own weights (levels: [n] int32 bytes)."""
    return constriction.stream.model.Categorical(
        _probabilities(np.array(WEIGHTS, dtype=np.int64)[np.frombuffer(levels, np.int32)]),
        perfect=False)


def available() -> bool:
    return constriction is not None


def codec_for(fingerprint: str, vocab_size: int) -> QCodec | None:
    """This end's coded-q codec for a tokenizer, or None when the coder is not installed."""
    if not available() or vocab_size <= 0:
        return None
    return _codec(load_prior(fingerprint, vocab_size))


@functools.lru_cache(maxsize=8)
def _codec(prior: IdPrior) -> QCodec:
    return QCodec(prior)
