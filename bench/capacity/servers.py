"""The server under test, one process pinned to one core: the Tandem verifier (`tandem-cloud
serve`, which also generates every token itself for cloud-only) or vLLM alone (`vllm serve`
from .venv-vllm, OpenAI API). The driver that emulates the users pins itself to the other cores.

Pinning is sched_setaffinity in the child before exec, so every thread and child process of
the server (vLLM's engine core, torch's intra-op pool) stays on that core; torch / OpenMP are
told to use one thread, as they would be on a one-core slice.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import astuple, dataclass, field
from pathlib import Path

import grpc
import httpx

from bench.load import cpu_seconds
from bench.processes import command, free_port, launch_in, wait_until

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
START_TIMEOUT_S = 240.0


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a process and every live descendant (vLLM's engine runs in a child)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        seconds = cpu_seconds(current)
        if seconds is None and current == pid:
            return None
        total += seconds or 0.0
        stack += children.get(current, [])
    return total


def machine_busy_seconds() -> float:
    """CPU seconds every process on the machine has used (all cores, /proc/stat), so that a
    point can tell how much of the machine something else took."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def pin_self(cores: set[int]) -> None:
    os.sched_setaffinity(0, cores)


def server_core_split(cores: Sequence[int]) -> tuple[set[int], set[int]]:
    """(the servers' cores, the driver's cores). With no core left they share them. The
    machine's cores, not this process's affinity: the driver has pinned itself to its own once
    a run has started, and a second cell must split the same way."""
    available = set(range(os.cpu_count() or 1))
    missing = set(cores) - available
    if missing:
        raise ValueError(f"cores {sorted(missing)} are not available to this process ({sorted(available)})")
    rest = available - set(cores)
    return set(cores), rest or set(cores)


@dataclass(frozen=True)
class TokenTotals:
    """What the verifier charged its committed tokens per mode since it started (Info.batches)."""
    speculate_ms: float
    speculate_tokens: int
    cloud_ms: float
    cloud_tokens: int


@dataclass
class ServerProcess:
    """A started server: its address (host:port), pid and log."""
    kind: str                 # "tandem" | "vllm"
    address: str
    pid: int
    log_path: Path
    model: str = ""
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.address.rsplit(":", 1)
        return host, int(port)

    def cpu_seconds(self) -> float | None:
        return tree_cpu_seconds(self.pid)

    def info(self):
        """The Tandem verifier's InfoReply (passes, price, position cost); None for vLLM or when
        it does not answer."""
        if self.kind != "tandem":
            return None
        from tandem.v1 import decoding_pb2 as pb
        from tandem.v1 import decoding_pb2_grpc as pb_grpc
        try:
            with grpc.insecure_channel(self.address) as channel:
                return pb_grpc.DecodingStub(channel).Info(pb.InfoRequest(), timeout=10)
        except grpc.RpcError:
            return None

    def batched_passes(self) -> int | None:
        """Forward passes the Tandem verifier has run (Info.batches); None for vLLM."""
        info = self.info()
        return None if info is None else int(info.batches.passes)

    def token_totals(self) -> TokenTotals | None:
        """Pass ms charged to committed tokens and those tokens, per mode, since start
        (Info.batches, cloud/token_cost.py); None for vLLM."""
        info = self.info()
        if info is None:
            return None
        b = info.batches
        return TokenTotals(b.speculate_ms, b.speculate_tokens, b.cloud_ms, b.cloud_tokens)

    def close(self) -> None:
        self._stack.close()


@dataclass
class ServerGroup:
    """The servers of one configuration (one unless --verifiers asks for more): user u is
    served by servers[u % len(servers)] (a balancer with session affinity, in effect)."""
    servers: list[ServerProcess]

    @property
    def model(self) -> str:
        return self.servers[0].model

    def for_user(self, user: int) -> ServerProcess:
        return self.servers[user % len(self.servers)]

    def cpu_seconds(self) -> float | None:
        readings = [s.cpu_seconds() for s in self.servers]
        return None if any(r is None for r in readings) else sum(readings)

    def batched_passes(self) -> int | None:
        readings = [s.batched_passes() for s in self.servers]
        return None if any(r is None for r in readings) else sum(readings)

    def token_totals(self) -> TokenTotals | None:
        readings = [s.token_totals() for s in self.servers]
        if not readings or any(r is None for r in readings):
            return None
        return TokenTotals(*(sum(values) for values in zip(*map(astuple, readings))))

    def prices(self) -> tuple[float, float | None] | None:
        """(the price, the position cost) the verifiers say now, means over them (position
        cost None while one has not measured it); None for vLLM."""
        infos = [s.info() for s in self.servers]
        if not infos or any(i is None for i in infos):
            return None
        costs = [i.position_cost for i in infos if i.HasField("position_cost")]
        return (sum(i.price for i in infos) / len(infos),
                sum(costs) / len(costs) if len(costs) == len(infos) else None)

    def close(self) -> None:
        for server in self.servers:
            server.close()


def one_thread_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return env


def start_verifier(cloud_config: Path, core: int, log_dir: Path, max_users: int,
                   sets: Sequence[str] = ()) -> ServerProcess:
    """`tandem-cloud serve` on a free loopback port, pinned to `core`, sized for max_users
    concurrent sessions (streams, sessions and worker threads: an operator sizes these for the
    users it serves; the shipped 64 sessions would refuse a larger sweep)."""
    stack = ExitStack()
    port = free_port()
    log_path = log_dir / "verifier.log"
    argv = [command("tandem-cloud"), "serve", "--config", str(cloud_config), "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "WARNING",
            "--set", "model.threads=1",
            "--set", f"limits.max_sessions={max(64, max_users + 8)}",
            "--set", f"server.max_workers={max(32, max_users + 16)}"]
    for item in sets:
        argv += ["--set", item]
    process = launch_in(stack, argv, log_path, env=one_thread_env(), core=core)
    address = f"127.0.0.1:{port}"
    server = ServerProcess("tandem", address, process.pid, log_path, _stack=stack)
    try:
        wait_until(lambda: server.batched_passes() is not None, process, "the verifier",
                   START_TIMEOUT_S, log_path)
    except BaseException:
        stack.close()
        raise
    return server


def start_vllm(model_dir: Path, core: int, log_dir: Path, max_users: int,
               python: Path = VLLM_PYTHON) -> ServerProcess:
    """`vllm serve` (the CPU build in .venv-vllm) on a free loopback port, pinned to `core`:
    what an operator would run instead of Tandem, serving the same target."""
    if not python.exists():
        raise FileNotFoundError(f"{python} is missing: make it with `bash scripts/bootstrap.sh --vllm`")
    stack = ExitStack()
    port = free_port()
    log_path = log_dir / "vllm.log"
    env = one_thread_env()
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_LOGGING_LEVEL="WARNING")
    name = model_dir.name
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--enforce-eager", "--max-num-seqs", str(max(16, max_users)),
            "--disable-log-stats"]
    process = launch_in(stack, argv, log_path, env=env, core=core)
    base = f"127.0.0.1:{port}"
    server = ServerProcess("vllm", base, process.pid, log_path, model=name, _stack=stack)
    try:
        wait_until(lambda: httpx.get(f"http://{base}/v1/models", timeout=2).status_code == 200,
                   process, "vllm serve", START_TIMEOUT_S, log_path)
    except BaseException:
        stack.close()
        raise
    return server
