"""The target runtime: incremental scores equal a plain full forward, rollback then re-extend
equals fresh, a batched ragged pass equals each session alone, memory accounting, and a
model directory of another architecture (GPT-2) loads and batches the same way."""
from __future__ import annotations

import shutil

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from cloud.runtime.target import TargetRuntime
from verifier_harness import TEST_DEVICE

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

# float32 rows of the same positions computed in differently shaped passes differ by rounding
# alone: ~1e-6 here, but 1.05e-5 on CI's CPU (rollback then re-extend) and on an H200, whose
# kernels change with the shape. A real cache error (a stale or shifted row) is ~0.1-1 apart.
ATOL = 1e-4


@pytest.fixture(scope="module")
def runtime(target_dir) -> TargetRuntime:
    torch.set_num_threads(1)
    return TargetRuntime(target_dir, device="auto", dtype="float32")


@pytest.fixture(scope="module")
def contexts(runtime, heldout_prompts) -> list[list[int]]:
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(runtime.model_dir)
    tokens = tokenizer("".join(heldout_prompts[:20]))["input_ids"]
    lengths, contexts, offset = (40, 7, 63, 2, 25), [], 0
    for length in lengths:
        contexts.append(tokens[offset: offset + length])
        offset += length
    assert [len(context) for context in contexts] == list(lengths)
    return contexts


def _full_logits(runtime: TargetRuntime, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return runtime.model(torch.tensor([tokens], device=runtime.device)).logits[0].float().cpu()


def test_loads_with_the_attributes_the_service_needs(runtime, target_dir):
    assert runtime.name == target_dir.name
    assert runtime.vocab_size == runtime.model.config.vocab_size
    assert runtime.fingerprint.startswith("sha256:")
    assert runtime.device.type in ("cpu", "cuda") and runtime.dtype == "float32"
    assert runtime.max_context == runtime.model.config.max_position_embeddings
    config = runtime.model.config
    head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
    float32_bytes = 4
    assert runtime.bytes_per_token == \
        2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * float32_bytes


def test_a_round_scores_pending_plus_block_like_a_full_forward(runtime, contexts):
    """Prefill context[:-1], then score [pending] + block: the k + 1 rows equal a plain forward
    over context + block."""
    context, block = contexts[0], [11, 12, 13, 14]
    state = runtime.new_state()
    runtime.score(state, context[:-1])
    scores = runtime.score(state, [context[-1]] + block)                          # [k + 1, vocab]
    full = _full_logits(runtime, context + block)[len(context) - 1:]
    assert scores.shape == (len(block) + 1, runtime.vocab_size)
    assert (scores - full).abs().max() < ATOL
    assert state.length == len(context) + len(block)


def test_rollback_then_re_extend_equals_fresh(runtime, contexts):
    context = contexts[2]
    state = runtime.new_state()
    runtime.score(state, context)
    runtime.score(state, [5, 6, 7, 8, 9])              # a block that is then rejected
    runtime.rollback(state, len(context) - 3)
    again = runtime.score(state, context[-3:] + [42])
    fresh_state = runtime.new_state()
    fresh = runtime.score(fresh_state, context + [42])[-4:]
    assert (again - fresh).abs().max() < ATOL
    assert state.length == fresh_state.length == len(context) + 1
    with pytest.raises(ValueError, match="roll back"):
        runtime.rollback(state, state.length + 1)


def test_batched_ragged_forward_equals_each_session_alone(runtime, contexts):
    """Sessions with different past lengths (including an empty past) and different numbers of
    new tokens, in one pass; its 1-token rows beside blocks (attended as their own layout)."""
    splits = [30, 1, 50, 0, 20]        # past length of each session before the batched pass
    new_lengths = [10, 1, 13, 2, 1]    # new tokens each feeds in it
    alone, batched_states = [], []
    for context, past, n in zip(contexts, splits, new_lengths):
        state = runtime.new_state()
        if past:
            runtime.score(state, context[:past])
        alone.append(runtime.score(state, context[past: past + n]))
        batched_state = runtime.new_state()
        if past:
            runtime.score(batched_state, context[:past])
        batched_states.append(batched_state)

    before = runtime.forward_passes
    batched = runtime.forward([(state, context[past: past + n]) for state, context, past, n
                               in zip(batched_states, contexts, splits, new_lengths)])
    assert runtime.forward_passes == before + 1
    for one, many, n in zip(alone, batched, new_lengths):
        many = many.cpu()  # the pass's rows stay on the runtime's device
        assert many.shape == (n, runtime.vocab_size)
        assert torch.equal(one.argmax(-1), many.argmax(-1))
        assert (one - many).abs().max() < 1e-4
    # The caches came back split correctly: a next single step equals a fresh full forward.
    for state, context, past, n in zip(batched_states, contexts, splits, new_lengths):
        step = runtime.score(state, [3])[-1]
        assert (step - _full_logits(runtime, context[: past + n] + [3])[-1]).abs().max() < ATOL


def test_memory_accounting_follows_the_cache_length(runtime, contexts):
    state = runtime.new_state()
    assert state.nbytes == 0
    runtime.score(state, contexts[0])
    assert state.nbytes == len(contexts[0]) * runtime.bytes_per_token
    runtime.rollback(state, 5)
    assert state.nbytes == 5 * runtime.bytes_per_token
    state.release()
    assert state.nbytes == 0 and state.length == 0


def test_refuses_a_directory_that_is_not_a_model(tmp_path, target_dir):
    with pytest.raises(FileNotFoundError, match="config.json"):
        TargetRuntime(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        TargetRuntime(target_dir, dtype="int8")


def test_loads_and_batches_another_architecture(tmp_path, target_dir):
    """Any local HF causal LM: a GPT-2 (learned absolute positions, fused QKV) made here."""
    model_dir = tmp_path / "tiny-gpt2"
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=4096, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(target_dir / name, model_dir / name)
    runtime = TargetRuntime(model_dir, device=TEST_DEVICE, dtype="float32")
    assert runtime.max_context == 128 and runtime.vocab_size == 4096

    contexts = [[7, 8, 9, 10, 11, 12], [100, 200, 300], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    states = [runtime.new_state() for _ in contexts]
    runtime.forward([(state, context[:-2]) for state, context in zip(states, contexts)])
    batched = runtime.forward([(state, context[-2:]) for state, context in zip(states, contexts)])
    for context, scores in zip(contexts, batched):
        assert (scores.float().cpu() - _full_logits(runtime, context)[-2:]).abs().max() < ATOL


def test_the_pool_grows_without_changing_what_sessions_hold(target_dir, contexts):
    """A pool of 1 slot x 16 positions: more sessions and longer contexts reallocate it; every
    session's next rows still equal a plain full forward, and released slots are reused."""
    from cloud.runtime.kv import KVPool
    runtime = TargetRuntime(target_dir, device=TEST_DEVICE)
    runtime.pool = KVPool(runtime.device, runtime.max_context, slots=1, capacity=16)
    long_context = (contexts[0] + contexts[2] + contexts[4]) * 2                  # 256 tokens
    states = [runtime.new_state() for _ in range(3)]
    runtime.score(states[0], contexts[1])
    runtime.forward([(states[1], contexts[0]), (states[2], long_context[:-1])])
    assert runtime.pool.slots >= 3 and runtime.pool.capacity >= len(long_context) - 1
    for state, context in zip(states, (contexts[1], contexts[0], long_context[:-1])):
        step = runtime.score(state, [3])[-1]
        assert (step - _full_logits(runtime, context + [3])[-1]).abs().max() < ATOL
    slot = states[1].slot
    states[1].release()
    again = runtime.new_state()
    runtime.score(again, [1, 2])
    assert again.slot == slot
    dropped = states[2].slot
    del states[2], state  # dropped without release: its slot comes back when it is collected
    fresh = runtime.new_state()
    runtime.score(fresh, [1])
    assert fresh.slot == dropped


def test_the_position_probe_measures_without_leaving_a_trace(runtime, contexts):
    """The pass model (cloud/token_cost.py: c, what one more fed position adds to a pass; F, a
    pass's fixed part; the blocks' own layout beside 1-token rows, Fb and cb) is measured once,
    positive for a target on a CPU where it must be, and leaves the runtime as it was: no pass
    counted, every probe slot free again, sessions' caches untouched."""
    state = runtime.new_state()
    before = runtime.score(state, contexts[0][:12])
    passes, free = runtime.forward_passes, len(runtime.pool._free)
    model = runtime.pass_model
    assert model.position_ms > 0.0 and runtime.pass_model is model  # measured once, then kept
    assert runtime.position_ms == model.position_ms
    assert 0.0 < model.fixed_ms  # a pass costs something before any session's share
    assert model.block_fixed_ms >= 0.0 and model.block_position_ms >= 0.0
    assert runtime.forward_passes == passes and len(runtime.pool._free) >= free
    state.rollback(11)
    again = runtime.score(state, contexts[0][11:12])
    torch.testing.assert_close(again[0], before[-1], atol=ATOL, rtol=0)
    state.release()
