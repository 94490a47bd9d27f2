"""Exact with the price loop on: a verifier whose price is 1 (batch.target_queue_ms = 0), the
adaptive controller answering it (edge/control/pricing.py), through a 5 ms link emulator.
Greedy output is the target's token for token, where the price makes the controller speculate
(a floor every option meets) and where the floor keeps it on cloud runs (a device too slow to
draft at the floor); sampled output follows the target's law (chi-square on the first three
tokens, as tests/system/test_e2e_pipelined.py) where it speculates. With the measured-cost pricing
forced on (the view says what the verifier measured a committed token costs it per mode,
edge/control/pricing.py), the same: greedy where speculation reads dearer (the cloud generates)
or cheaper (it speculates), sampled where it reads cheaper."""
from __future__ import annotations

import dataclasses

import httpx
import pytest
import torch
from sampling_law import chi_square_pvalue, spread_prompt
from verifier_harness import TEST_DEVICE, channel_to, open_draft
from verifier_harness import (edge_tokenizer, prompt_ids, reference,  # noqa: F401 (fixtures)
                              target_runtime)

from sim.netem import ChannelProfile, ChannelProxy
from cloud.config import BatchSettings, CloudConfig, ModelSettings, ServerSettings
from cloud.server import create_server
from edge.client import EdgeClient
from edge.request import GenerationRequest
from edge.config import ClientConfig, CloudLinkConfig, DaemonConfig, DeviceProfile, EdgeConfig
from edge.daemon.server import DaemonThread, load_pool
from edge.runtime import DraftConfig
from edge.control.adaptive import AdaptivePolicy
from edge.control.policy import Plan, RoundView
from tandem.sampling import SamplingParams

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)

NEW_TOKENS = 48
SAMPLES = 240


class Seen(AdaptivePolicy):
    """The adaptive controller, keeping the prices its views carried; token_ms: the measured
    costs per committed token (speculate, cloud) every view says, forced."""

    def __init__(self, config: ClientConfig, token_ms=None) -> None:
        super().__init__(config)
        self.prices: list[float] = []
        self.token_ms = token_ms

    def plan(self, view: RoundView) -> Plan:
        self.prices.append(view.price)
        if self.token_ms is not None:
            view = dataclasses.replace(view, token_ms=self.token_ms)
        return super().plan(view)


# floor 0: every option meets it, the price decides (speculation); a device drafting 5 tok/s
# cannot meet the default floor of 10 by speculating, so the cloud generates despite the price
CASES = {
    "priced-speculates": dict(min_tokens_per_s=0.0),
    "floor-keeps-cloud": dict(device=DeviceProfile(max_draft_tokens_per_s=5)),
    "measured-dearer": dict(min_tokens_per_s=0.0),
    "measured-cheaper": dict(min_tokens_per_s=0.0),
}
FORCED = {"measured-dearer": (2.0, 1.0), "measured-cheaper": (0.5, 1.0)}  # ms a token


@pytest.fixture
def dear_link(target_runtime):
    """A verifier priced at 1 behind a 5 ms (one way) link emulator: its port. Each test's own:
    where the price decides by measured figures, those of an earlier test's cloud runs would
    make its choice a coin toss on a noisy core (the forced cases say their figures; the rest
    speculate by the position-cost model until a cloud run is measured)."""
    config = CloudConfig(
        server=ServerSettings(host="127.0.0.1", port=0, shutdown_grace_s=0),
        model=ModelSettings(path=target_runtime.model_dir, device=TEST_DEVICE),
        batch=BatchSettings(window_ms=0, target_queue_ms=0))
    server, port = create_server(config, target_runtime)
    server.start()
    try:
        with ChannelProxy(ChannelProfile(name="short", delay_ms=5.0),
                          upstream=("127.0.0.1", port)) as proxy:
            yield proxy.address[1]
    finally:
        server.stop(0).wait()


@pytest.fixture(scope="module")
def draft(draft_dir, gguf_path, onnx_path):
    runtime = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    yield runtime
    runtime.close()


def _client(port: int, draft, case: str) -> tuple[EdgeClient, Seen]:
    config = ClientConfig(policy="adaptive", draft_ahead=True, send_ahead=2, max_q_entries=16,
                          **CASES[case])
    policy = Seen(config, FORCED.get(case))
    return EdgeClient(channel_to(port), draft, config, policy=policy), policy


def _modes(result) -> set[str]:
    return {r.mode for r in result.rounds_log}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_output_is_the_targets_at_price_one(case, dear_link, draft, prompt_ids,
                                                   reference):
    client, policy = _client(dear_link, draft, case)
    modes: set[str] = set()
    for ids in prompt_ids[80:82]:
        result = client.generate(GenerationRequest(ids, NEW_TOKENS))
        assert result.token_ids == reference.greedy(ids, 64)[:NEW_TOKENS], case
        assert all(result.verified) and result.finish_reason == "length"
        modes |= _modes(result)
    assert policy.prices and set(policy.prices) == {1.0}
    if case in ("priced-speculates", "measured-cheaper"):
        assert "cloud" not in modes and "verify" in modes
    else:
        assert "cloud" in modes


@pytest.mark.parametrize("case", ["priced-speculates", "measured-cheaper"])
def test_sampled_output_follows_the_targets_law_at_price_one(case, dear_link, draft, prompt_ids,
                                                             reference):
    """The priced branch speculating, by the position-cost model and by measured costs (~25 s
    each: 240 sampled generations; its cloud runs are the executor tests/system/test_e2e_pipelined.py
    checks at price 0, whoever chooses them)."""
    params = SamplingParams(temperature=1.0, top_k=3, seed=0)
    ids, law = spread_prompt(reference.model, prompt_ids[100:130], params, SAMPLES)
    client, policy = _client(dear_link, draft, case)
    counts: dict[tuple, int] = {}
    modes: set[str] = set()
    for seed in range(SAMPLES):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        result = client.generate(GenerationRequest(ids, 4, sampling=sampling))
        key = tuple(result.token_ids[:3])
        assert key in law, f"sampled {key}, impossible for the target"
        assert all(result.verified)
        counts[key] = counts.get(key, 0) + 1
        modes |= _modes(result)
    pvalue = chi_square_pvalue(law, counts, SAMPLES)
    print(f"{case}: chi-square p = {pvalue:.3f}, modes {modes}")
    assert pvalue > 1e-3
    assert set(policy.prices) == {1.0}
    assert "verify" in modes and "cloud" not in modes


@pytest.fixture
def slow_device_daemon(dear_link, gguf_path, draft_dir):
    """An edge daemon (adaptive, a device drafting 5 tok/s) in front of the test's own dear
    verifier."""
    config = EdgeConfig(
        cloud=CloudLinkConfig(address=f"127.0.0.1:{dear_link}"),
        draft=DraftConfig(backend="llama.cpp", model_path=gguf_path, tokenizer_dir=draft_dir,
                          n_ctx=512, threads=1),
        client=ClientConfig(policy="adaptive", device=DeviceProfile(max_draft_tokens_per_s=5)),
        daemon=DaemonConfig(port=0, pool_size=1, max_tokens_limit=64))
    with DaemonThread(load_pool(config)) as running:
        yield running


def test_a_request_states_its_own_floor(slow_device_daemon, prompt_ids, reference):
    """`min_tokens_per_s` in the request body (extra_body): a request asking for 0 tok/s lets
    the price decide, and every round is a drafted block; with the client's floor of 15 the
    slow device cannot speculate fast enough and the cloud generates despite the price. Both
    outputs are the target's. Floor 0 goes first, on a verifier that has measured no cloud run:
    the position-cost model decides (pricing.py: until both figures are said), not the measured
    ratio of two modes' noisy figures, which would be the cost test's subject, not the floor's."""
    ids = prompt_ids[83]
    body = {"model": "tandem-draft", "prompt": ids, "max_tokens": 32, "temperature": 0,
            "ignore_eos": True, "tandem_trace": True, "return_token_ids": True}
    modes = {}
    with httpx.Client(base_url=slow_device_daemon.url, timeout=120) as http:
        for floor in (0.0, None):
            response = http.post("/v1/completions", json={**body, "min_tokens_per_s": floor})
            assert response.status_code == 200, response.text
            out = response.json()
            assert out["choices"][0]["token_ids"] == reference.greedy(ids, 64)[:32]
            modes[floor] = {r["mode"] for r in out["tandem"]["trace"]}
        refused = http.post("/v1/completions", json={**body, "min_tokens_per_s": -1})
    assert modes[0.0] == {"verify"}
    assert "cloud" in modes[None]
    assert refused.status_code == 400 and "min_tokens_per_s" in refused.text
