"""The vLLM backend: the target on a vLLM AsyncLLM engine (paged KV cache, continuous batching,
prefix caching, tensor/pipeline/data parallel), behind the TargetBackend interface.

How a block is scored, exactly. vLLM computes logits only where it samples, so row j of a
round (the distribution after [pending] + x_1..x_j) is one request: prompt = the session's
context + x_1..x_j, one generated token. A round of k draft tokens is k + 1 requests, sent
together; vLLM's scheduler batches them with every other session's (continuous batching), and
its prefix cache serves each prompt's shared head, so a request computes only the tokens past
the last full cached block (block_size, 32 by default) plus its share of the block. What each
request returns depends on the session:

  greedy     no logprobs: the generated token is the row's argmax (vLLM's greedy sampler);
             the row is returned as 0 at that id and -inf elsewhere, which the greedy test
             reads exactly as the full row.
  sampling   the row's raw logits (engine logprobs_mode "raw_logits", flat_logprobs) on the
             top_k + 1 ids, or the whole vocabulary without top_k; other ids -inf. The engine
             warps them with tandem.sampling.warp and runs the same rejection test as on the
             torch backend: top-k keeps only the k largest logits, so the warp of the partial
             row equals the warp of the full row. A tie at the k-th logit (the (k+1)-th value
             equals the k-th) would need ids beyond those returned: that row is fetched again
             with the whole vocabulary.

One request per round, where the engine can (the V2 model runner, CUDA): prompt = context +
block, prompt_logprob_start = the first row read, prompt_logprob_token_ids = every id of the
vocabulary for each prompt row read (raw logits, whole rows: the argmax for greedy, any top_k
for sampling) and logprobs=-1 for the last row (the generated position), with the prefix
cache read as for any request (rows before prompt_logprob_start are not needed). At start a
probe request decides (capability check, not a version check; vllm.scoring may pin either
path); the log says which path was taken ("scoring: one request per round" or "... per row").
A per-round request the engine refuses, or answers without its rows, is scored per row, and
so is every round after it (a warning says so): a round is never lost to the faster path. Plain
prompt_logprobs is never used: vLLM turns the prefix cache off for it and scores every row.
The per-row requests keep the prefix cache on, and a re-opened session (after an eviction)
finds its context still cached while vLLM has room.

Sessions hold only their token ids here: the KV lives in vLLM's paged cache, which grows with
the tokens each request holds (whole blocks), never with the longest session in a batch.

The engine runs on its own asyncio loop in a daemon thread; submit() is thread-safe and returns
a concurrent Future, so the verifier's per-stream threads never block each other.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cloud.backend import BackendInfo, TargetBackend
from cloud.batcher import ForwardResult
from cloud.config import ModelSettings, VllmSettings
from cloud.errors import InvalidRequest, Unavailable
from cloud.runtime.vllm_support import refuse_unsupported_head_dim
from cloud.verify import RoundCheck
from tandem.fingerprint import tokenizer_fingerprint
from tandem.sampling import SamplingParams

log = logging.getLogger(__name__)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_keys = itertools.count()


class VllmMissing(RuntimeError):
    """model.backend is vllm but the vllm package is not importable here."""


@dataclass
class VllmState:
    """A session on the vLLM backend: the ids it has fed (its KV is in vLLM's prefix cache)."""
    params: SamplingParams
    tokens: list[int] = field(default_factory=list)
    key: int = field(default_factory=_keys.__next__)  # request ids, data-parallel affinity

    @property
    def length(self) -> int:
        return len(self.tokens)

    def release(self) -> None:
        self.tokens = []


class VllmBackend(TargetBackend):
    kind = "vllm"

    def __init__(self, model: ModelSettings, settings: VllmSettings,
                 start_timeout_s: float = 600.0) -> None:
        try:
            import vllm  # noqa: F401 - fail early with the install hint
        except ImportError as exc:
            raise VllmMissing(
                "model.backend is vllm but vLLM is not installed in this environment: make it "
                "with `scripts/bootstrap.sh --vllm` and run .venv-vllm/bin/tandem-cloud (on GPU "
                "hosts: pip install vllm)") from exc
        from transformers import AutoConfig, AutoTokenizer

        from cloud.runtime.target import model_context_limit

        started = time.perf_counter()
        self.model_dir = Path(model.resolved_path())
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{self.model_dir}: not an HF model directory (no config.json)")
        self.settings = settings
        self.name = model.name or self.model_dir.name
        self.dtype = settings.dtype or model.dtype
        config = AutoConfig.from_pretrained(self.model_dir, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        text = config.get_text_config()
        self.vocab_size = int(text.vocab_size)
        own_limit = model_context_limit(config, tokenizer)
        self.max_context = min(settings.max_model_len or own_limit, own_limit)
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        refuse_unsupported_head_dim(str(getattr(config, "model_type", "?")), head_dim)
        kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self.bytes_per_token = (2 * text.num_hidden_layers * kv_heads * head_dim
                                * DTYPE_BYTES[self.dtype])
        self.max_logprobs = settings.max_logprobs or self.vocab_size

        self._closed = False
        self._in_flight = 0          # requests submitted and not finished
        self.requests = 0            # engine requests so far
        self.prompt_tokens = 0       # prompt tokens of those requests
        self.cached_tokens = 0       # of which the prefix cache served
        self.tie_refetches = 0       # rows fetched again with the whole vocabulary
        self.per_round = False       # one request per round (see the module docstring)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tandem-vllm",
                                        daemon=True)
        self._thread.start()
        try:
            self._run(self._start(), start_timeout_s)
        except BaseException:
            self.close(timeout=30)
            raise
        self.device = f"{self._platform} (vllm, tp={settings.tensor_parallel_size}, " \
                      f"dp={settings.data_parallel_size})"
        log.info("target %s on vLLM %s (%s, %s) in %.1f s: vocab %d, max context %d, block %d, "
                 "prefix caching %s", self.name, self._version, self._platform, self.dtype,
                 time.perf_counter() - started, self.vocab_size, self.max_context,
                 settings.block_size, "on" if settings.enable_prefix_caching else "off")

    # --- engine life --------------------------------------------------------------------------
    async def _start(self) -> None:
        import vllm
        from vllm import AsyncEngineArgs
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        self._version = vllm.__version__
        self._platform = current_platform.device_type
        settings = self.settings
        if self._platform == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kv_cache_gib))
        args = dict(
            model=str(self.model_dir), dtype=self.dtype, seed=settings.seed,
            max_model_len=self.max_context,
            tensor_parallel_size=settings.tensor_parallel_size,
            pipeline_parallel_size=settings.pipeline_parallel_size,
            data_parallel_size=settings.data_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enable_prefix_caching=settings.enable_prefix_caching,
            block_size=settings.block_size, max_num_seqs=settings.max_num_seqs,
            enforce_eager=settings.enforce_eager,
            # Rows come back as raw logits; tandem's own warp and test decide from them. No cap
            # in the engine: the tandem-level cap (max_logprobs) is checked at Open, and a tie
            # at the k-th logit may need a whole row.
            max_logprobs=-1, logprobs_mode="raw_logits", disable_log_stats=True)
        if settings.max_num_batched_tokens:
            args["max_num_batched_tokens"] = settings.max_num_batched_tokens
        args.update(settings.engine_args)
        self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        self._tokens_prompt = TokensPrompt
        final = RequestOutputKind.FINAL_ONLY

        def params(**kwargs) -> VllmSamplingParams:
            return VllmSamplingParams(**{"max_tokens": 1, "temperature": 0.0,
                                         "detokenize": False, "output_kind": final, **kwargs})

        self._params = params
        self._greedy = params()
        # The first request after start, and the first with logprobs, pay a warm-up of seconds.
        await self._request([1, 2, 3], self._greedy, 0)
        await self._request([1, 2, 3], params(logprobs=-1, flat_logprobs=True), 0)
        if settings.scoring == "auto":
            self.per_round = await self._probe_per_round()
            why = "prompt_logprob_token_ids, V2 model runner" if self.per_round else \
                "this engine refused prompt_logprob_token_ids: V1 model runner"
        else:
            self.per_round = settings.scoring == "per_round"
            why = f"vllm.scoring: {settings.scoring}"
        log.info("vLLM scoring: one request per %s (%s)", "round" if self.per_round else "row",
                 why)

    async def _probe_per_round(self) -> bool:
        """Whether this engine scores chosen prompt rows in one request (capability check)."""
        try:
            output = await self._request([1, 2, 3, 4], self._round_params(1, 2), 0)
            rows = getattr(output, "prompt_token_id_logprobs", None)
            return rows is not None and tuple(_as_tensor(rows).shape) == (2, self.vocab_size)
        except Exception as exc:  # noqa: BLE001 - any refusal means: not on this engine
            log.debug("prompt_logprob_token_ids refused: %s", exc)
            return False

    def _round_params(self, start: int, prompt_rows: int):
        """One request scoring whole rows start..start + prompt_rows - 1 of the prompt, plus
        the last (generated) position."""
        import numpy as np
        extra = {}
        if prompt_rows:
            ids = np.broadcast_to(np.arange(self.vocab_size, dtype=np.int64),
                                  (prompt_rows, self.vocab_size)).copy()
            extra = dict(prompt_logprob_start=start, prompt_logprob_token_ids=ids,
                         skip_reading_prefix_cache=False)
        return self._params(logprobs=-1, flat_logprobs=True, **extra)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new work, let requests in flight finish (up to `timeout`), stop the engine and
        its processes, stop the loop."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + (30.0 if timeout is None else timeout)
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        engine = getattr(self, "_engine", None)
        if engine is not None and self._thread.is_alive():
            # Shut down on the loop that owns it, and drop it there: vLLM's __del__ would
            # otherwise run again at interpreter exit, when its module globals are gone.
            async def stop() -> None:
                engine.shutdown()
                self._engine = None
            try:
                self._run(stop(), max(deadline - time.monotonic(), 10.0))
            except Exception:  # noqa: BLE001 - stopping anyway; say what went wrong
                log.exception("vLLM engine shutdown failed")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def _run(self, coroutine, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    # --- the interface ------------------------------------------------------------------------
    def new_state(self, params: SamplingParams) -> VllmState:
        return VllmState(params=params)

    def check_sampling(self, params: SamplingParams) -> None:
        if params.greedy:
            return
        need = self._ids_per_row(params)
        if need > self.max_logprobs:
            if 0 < params.top_k < self.vocab_size:
                setting = f"top_k={params.top_k}"
                hint = f"use top_k <= {self.max_logprobs - 1}"
            else:
                setting = "top_k=0 (off)" + (f" with top_p={params.top_p:g}"
                                              if 0 < params.top_p < 1 else "")
                hint = f"set top_k <= {self.max_logprobs - 1}"
            raise InvalidRequest(
                f"sampling with {setting} cannot be verified exactly on this server: it needs "
                f"the target's logits on {need} ids per position and the vLLM backend returns "
                f"at most vllm.max_logprobs={self.max_logprobs}; {hint}, or ask the operator "
                "to raise vllm.max_logprobs")

    def submit(self, state: VllmState, tokens: Sequence[int], *, alone: bool = False,
               rows: int | None = None, check: RoundCheck | None = None) -> Future:
        # `check` is not run here: the engine tests the rows this returns.
        if self._closed:
            raise Unavailable("the verifier is shutting down")
        tokens = list(tokens)
        assert tokens, "every request needs at least one new token"
        rows = len(tokens) if rows is None else min(rows, len(tokens))
        prefix = list(state.tokens)
        state.tokens.extend(tokens)
        return asyncio.run_coroutine_threadsafe(
            self._score(state.key, state.params, prefix, tokens, rows, time.perf_counter()),
            self._loop)

    def generate_greedy(self, prompt: Sequence[int], max_tokens: int) -> Future:
        """The target's own greedy decoding of max_tokens after prompt on vLLM's decode path
        (the target-only baseline of bench/verifier_bench.py); resolves to the token ids."""
        async def run() -> list[int]:
            output = await self._request(list(prompt), self._params(
                max_tokens=max_tokens, ignore_eos=True), 0)
            return list(output.outputs[0].token_ids)
        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def rollback(self, state: VllmState, length: int) -> None:
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot roll back to {length}: the session holds {state.length} "
                             "positions")
        del state.tokens[length:]

    def info(self) -> BackendInfo:
        return BackendInfo(kind=self.kind, device=self.device, in_flight=self._in_flight,
                           passes=self.requests,
                           details={"scoring": "per round" if self.per_round else "per row",
                                    "prompt_tokens": self.prompt_tokens,
                                    "cached_tokens": self.cached_tokens,
                                    "tie_refetches": self.tie_refetches,
                                    "block_size": self.settings.block_size})

    # --- scoring ------------------------------------------------------------------------------
    def _ids_per_row(self, params: SamplingParams) -> int:
        """Logits per row a sampled session needs: top_k + 1 (to see a tie at the k-th), or
        the whole vocabulary."""
        if 0 < params.top_k < self.vocab_size - 1:
            return params.top_k + 1
        return self.vocab_size

    async def _score(self, key: int, params: SamplingParams, prefix: list[int],
                     tokens: list[int], rows: int, submitted: float) -> ForwardResult:
        started = time.perf_counter()
        in_flight = self._in_flight
        rank = key % self.settings.data_parallel_size
        n = len(tokens)
        if rows == 0:  # a prefill: only the prefix cache is wanted
            await self._request(prefix + tokens, self._greedy, rank)
            logits = torch.empty((0, self.vocab_size))
        else:
            logits = await self._score_round(prefix, tokens, n - rows, rank) \
                if self.per_round else None
            if logits is None:
                logits = await self._score_rows(params, prefix, tokens, n - rows, rank)
        return ForwardResult(logits=logits, queue_ms=(started - submitted) * 1000.0,
                             forward_ms=(time.perf_counter() - started) * 1000.0,
                             batch_size=in_flight + max(rows, 1))

    async def _score_rows(self, params: SamplingParams, prefix: list[int], tokens: list[int],
                          first: int, rank: int) -> torch.Tensor:
        """Rows first..n-1 of a round, one request each: [n, vocab], rows before first NaN
        (never computed). A greedy row is its argmax alone (0 there, -inf elsewhere)."""
        n = len(tokens)
        logits = torch.full((n, self.vocab_size), math.nan)
        logits[first:] = -math.inf
        if params.greedy:
            outputs = await asyncio.gather(*(
                self._request(prefix + tokens[: j + 1], self._greedy, rank)
                for j in range(first, n)))
            for j, output in zip(range(first, n), outputs):
                logits[j, output.outputs[0].token_ids[0]] = 0.0
        else:
            need = self._ids_per_row(params)
            await asyncio.gather(*(self._fill_row(logits[j], prefix + tokens[: j + 1],
                                                  params, need, rank)
                                   for j in range(first, n)))
        return logits

    async def _score_round(self, prefix: list[int], tokens: list[int], first: int,
                           rank: int) -> torch.Tensor | None:
        """Rows first..n-1 of a round in one request: [n, vocab], rows before first NaN; None
        when the engine refused or answered without the rows (the caller scores per row)."""
        n = len(tokens)
        logits = torch.full((n, self.vocab_size), math.nan)
        try:
            output = await self._request(prefix + tokens, self._round_params(
                len(prefix) + first, n - 1 - first), rank)
        except Unavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a refusal: the per-row path still works
            self._stop_per_round(f"the engine refused the request: {exc}")
            return None
        if n - 1 - first:
            scored = getattr(output, "prompt_token_id_logprobs", None)
            if scored is None:
                self._stop_per_round("it answered without prompt_token_id_logprobs")
                return None
            logits[first: n - 1] = _as_tensor(scored)
        ids, values = _flat_row(output.outputs[0].logprobs)
        logits[n - 1] = -math.inf
        logits[n - 1, ids] = values
        return logits

    def _stop_per_round(self, why: str) -> None:
        """Per row from now on: a path that failed once is not worth a second request per
        round (the round in hand is scored per row)."""
        if self.per_round:
            self.per_round = False
            log.warning("vLLM scoring: a per-round request failed (%s); one request per row "
                        "from now on", why)

    async def _fill_row(self, row: torch.Tensor, prompt: list[int], params: SamplingParams,
                        need: int, rank: int) -> None:
        full = need >= self.vocab_size
        output = await self._request(
            prompt, self._params(logprobs=-1 if full else need, flat_logprobs=True), rank)
        ids, values = _flat_row(output.outputs[0].logprobs)
        if not full:
            ranked = torch.sort(values, descending=True).values
            if len(ranked) > params.top_k and ranked[params.top_k] >= ranked[params.top_k - 1]:
                # A tie at the k-th logit: the warp keeps every tied id, some may be missing.
                self.tie_refetches += 1
                output = await self._request(
                    prompt, self._params(logprobs=-1, flat_logprobs=True), rank)
                ids, values = _flat_row(output.outputs[0].logprobs)
        row[ids] = values

    async def _request(self, prompt: list[int], params, rank: int):
        request_id = f"tandem-{next(_keys)}"
        self._in_flight += 1
        try:
            final = None
            kwargs = {"data_parallel_rank": rank} if self.settings.data_parallel_size > 1 else {}
            async for output in self._engine.generate(
                    self._tokens_prompt(prompt_token_ids=prompt), params, request_id, **kwargs):
                final = output
        except Exception as exc:  # noqa: BLE001 - the engine died or refused: say so plainly
            if self._closed:
                raise Unavailable("the verifier is shutting down") from exc
            raise
        finally:
            self._in_flight -= 1
        self.requests += 1
        self.prompt_tokens += len(prompt)
        self.cached_tokens += final.num_cached_tokens or 0
        return final


def _as_tensor(rows) -> torch.Tensor:
    """prompt_token_id_logprobs (a tensor or an array) as float32 [rows, ids]."""
    return torch.as_tensor(rows, dtype=torch.float32).cpu()


def _flat_row(flat) -> tuple[torch.Tensor, torch.Tensor]:
    """ids and values of the first (only) position of a FlatLogprobs."""
    start, end = flat.start_indices[0], flat.end_indices[0]
    return (torch.tensor(flat.token_ids[start:end], dtype=torch.long),
            torch.tensor(flat.logprobs[start:end], dtype=torch.float32))
