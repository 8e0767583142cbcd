"""What a benchmark saves (``--json``) and ``bench report`` reads back: typed records, one dataclass per
kind, each written with its kind and the schema version (``record_files`` writes and reads them).

A record holds what was measured, never a verdict: every figure and verdict is derived from it again
by the current rules (``reports``). The shim's status in a child process is the shim's own typed
``Status``; where the data is another program's (a profiler's, a server's answer) it stays free-form,
and says so.
"""

from __future__ import annotations

import math
import platform
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from typing import Any, ClassVar, Protocol

from freetoken_graphfix.status_record import CapturePass, Status

from .settings import DeadlockSettings, RigSettings
from .stats import Summary


def largest_first(sizes: Iterable[str]) -> list[str]:
    """A record's batch sizes (its per-bs keys), largest first: the order the workload runs them in."""
    return sorted(set(sizes), key=lambda bs: -int(bs))


SCHEMA = 3  # 1: before kinds and schemas; 2: serve's capture passes as actions and reasons, an arm named
# pre-697 (``record_files.migrate`` reads both)


# ---------------------------------------------------------------- shared parts

@dataclass(frozen=True)
class Environment:
    """Where a record was measured."""

    gpu: str
    driver: str
    torch: str
    date: str
    cuda: str = ""
    freetoken: str | None = None  # the engine and serve records take it from their processes instead
    python: str = ""

    @classmethod
    def here(cls) -> Environment:
        """This machine's GPU, driver and versions, now."""
        import torch

        from freetoken_graphfix.compat import freetoken_version

        driver = "unknown"
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            pass
        return cls(torch.cuda.get_device_name(), driver, torch.__version__, date.today().isoformat(),
                   str(torch.version.cuda), freetoken_version(), platform.python_version())


@dataclass(frozen=True)
class Spin:
    """A positive control's spin kernel: its clocks and its own measured GPU time."""

    spin_cycles: int
    spin_us: float
    spin_us_range: list[float] = field(default_factory=list)
    target_us: float = math.nan
    step_us: float = math.nan  # the rig: skip's replay time the spin was aimed at a fraction of
    graph_us: float = math.nan  # the engine: the largest graph's time it was aimed at
    bs: int | None = None


# ---------------------------------------------------------------- the rig and its first-launch matrix

@dataclass
class GraphActions:
    """What the shim decided for one graph size, over the instances captured."""

    action: list[str]
    hook_ms: list[float]


@dataclass
class FirstLaunches:
    launch_ms: list[float]
    blocked: list[bool]


@dataclass
class RigArm:
    """One mode's graph instances in the rig: decisions, first launches, timed replays, gaps."""

    capture_s: list[float]
    graphs: dict[str, GraphActions]  # "bs=2" -> decisions
    first_launch: dict[str, FirstLaunches]  # bs -> every instance's first launch
    replay_us: dict[str, list[list[float]]]  # bs -> per instance, its timed replays
    logits_equal_upload: bool = True
    gaps_us: dict[str, list[float]] = field(default_factory=dict)  # ranked stream -> gaps (traced child)


@dataclass
class RigRecord:
    """``bench rig``: replay cost per mode on a decode-like graph behind a real PLE table's WAIT."""

    kind: ClassVar[str] = "rig"
    env: Environment
    config: RigSettings
    arms: dict[str, RigArm]
    command: str = ""
    control: Spin | None = None
    gaps_note: str = "n/a"
    stager_us: float = math.nan  # host µs a dispatch while a deferred graph awaits its first launch


@dataclass
class Probe:
    """One first-launch case of the matrix, in its own process."""

    mode: str
    kernels: int
    streams: int
    first_launch_ms: float = math.nan
    blocked: bool = False
    second_blocked: bool = False
    capture_s: float = math.nan
    action: str = ""
    hook_ms: float = math.nan
    error: str | None = None


@dataclass
class DeadlockRecord:
    """``bench deadlock``: does a first launch block, per graph size, streams and mode."""

    kind: ClassVar[str] = "deadlock"
    env: Environment
    config: DeadlockSettings
    probes: list[Probe]


# ---------------------------------------------------------------- start-up

@dataclass
class StartupRecord:
    """``bench startup``: ``python -c pass`` with and without the ``.pth``, paired run by run."""

    kind: ClassVar[str] = "startup"
    runs: int
    ms: dict[str, Summary]  # arm -> its start-up times
    delta_ms: dict[str, float]  # arm -> median of its paired differences to bare
    delta_band_ms: dict[str, list[float]]  # arm -> 95% interval of that median
    target_ms: float
    python: str = ""


# ---------------------------------------------------------------- FreeToken's real engine

@dataclass
class EngineProcess:
    """One engine process of one arm, as the engine child reported it (``engine/child/main.py``), or
    the error it ended with (``error``; the rest then left at its defaults)."""

    arm: str
    log: str = ""
    error: str | None = None
    torch: str = ""
    gpu: str = ""
    freetoken: str = ""
    freetoken_patched: bool = False
    freetoken_file: str = ""
    freetoken_uploads: bool = True
    table: str = ""
    wait_sync: bool = False
    fill_worker: bool = False
    hip: bool | None = None  # None: a record from before it was kept (the worker then meant HIP)
    graph_bs: list[int] = field(default_factory=list)
    captured_waits: int = 0
    self_released_waits: dict[str, int | None] = field(default_factory=dict)
    capture_ms: list[float] = field(default_factory=list)
    upload_ms: list[float] = field(default_factory=list)
    build_s: float = math.nan
    free_mib_after_capture: float = math.nan
    steps: dict[str, int] = field(default_factory=dict)  # prefill, decode and graph steps
    fires: list[Any] = field(default_factory=list)  # the watchdog's releases (free-form: what it saw)
    first_launch_ms: dict[str, float] = field(default_factory=dict)
    max_launch_ms: float | None = None
    first_launch_free_mib: dict[str, list[float]] = field(default_factory=dict)  # bs -> [before, after]
    first_step_gpu_ms: dict[str, float] = field(default_factory=dict)
    step_gpu_ms: dict[str, list[float]] = field(default_factory=dict)  # bs -> each graph step after the first
    step_host_ms: dict[str, list[float]] = field(default_factory=dict)
    graph_gpu_ms: dict[str, list[float]] = field(default_factory=dict)
    launch_gpu_ms: dict[str, list[float]] = field(default_factory=dict)
    step_exec: dict[str, list[str]] = field(default_factory=dict)  # bs -> the executable each step launched
    copies_made: dict[str, int] = field(default_factory=dict)
    control_spin: Spin | None = None
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    distinct_tokens: int = 0
    token_hash: str = ""
    token_ids: list[list[int]] = field(default_factory=list)
    shim: Status | None = None  # the shim's status() in that process
    copies_error: str | None = None
    launch_bs: list[int] = field(default_factory=list)  # a traced process: each graph launch's bs
    replay_gpu_ms: dict[str, list[float]] = field(default_factory=dict)  # from idle, the engine's own graph
    copies_gpu_ms: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)  # bs -> kind -> copies
    replay_error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the process ran to the end: a process that did not is reported, never measured."""
        return self.error is None

    def shim_actions(self) -> list[str]:
        """Every graph's action in this process, over its capture passes (empty without the shim)."""
        return self.shim.actions() if self.shim is not None else []


@dataclass
class TracedBs:
    """A traced process's kernel timeline at one batch size (``timeline.decode_timeline``)."""

    launches: int
    graph_kernels: float
    step_kernels: float | None
    busy_us: float | None
    streams: float
    gap_us: dict[str, float]  # ranked stream -> median gap
    gap_quantiles: dict[str, list[float]] = field(default_factory=dict)  # ranked stream -> 0..100th percentiles


@dataclass
class TracedRun:
    """One traced process of an arm: its kernel timeline per bs and its tokens, or why there is none."""

    note: str = ""
    by_bs: dict[str, TracedBs] = field(default_factory=dict)
    token_ids: list[list[int]] | None = None


@dataclass
class EngineCase:
    """One model's run of every arm, a process per arm and round, and the traced processes."""

    model: str
    label: str
    layers: int | None
    ft_args: list[str]
    context: int
    decode_steps: int
    rounds: int
    expects_wait: bool
    runs: dict[str, list[EngineProcess]]
    traced: dict[str, list[TracedRun]] = field(default_factory=dict)
    copies: int = 0
    env: Environment | None = None  # where it ran (each case measured on its own)
    command: str = ""


@dataclass
class EngineRecord:
    """``bench engine``: every arm in FreeToken's real offline engine, one case per model."""

    kind: ClassVar[str] = "engine"
    cases: list[EngineCase]


# ---------------------------------------------------------------- a real ft serve

@dataclass
class Request:
    phase: str  # before or after the rebuild
    round: str  # first or steady
    bs: int
    name: str
    hung: bool
    text: str = ""
    chunks: int = 0
    ttft_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    error: str | None = None


@dataclass
class ServeRun:
    """One arm's server: its requests, the rebuild, the stop, and the shim's status in each of its processes
    that captured graphs (``FT_GRAPHFIX_STATUS_DIR``)."""

    arm: str
    log: str = ""
    requests: list[Request] = field(default_factory=list)
    hung: int = 0
    ready_s: float = math.nan
    rebuild: dict[str, Any] | None = None  # the rebuild's HTTP answer (free-form: the server's own)
    cache_status: dict[str, Any] | None = None
    error: str | None = None
    stopped_by: str = ""
    exit_code: int | None = None
    stragglers: list[int] = field(default_factory=list)
    outlived: list[int] = field(default_factory=list)
    shims: list[Status] = field(default_factory=list)

    def passes(self) -> list[tuple[int, CapturePass]]:
        """Every capture pass of the server's processes, with its process's pid, by pid then pass."""
        return [(status.pid, p) for status in self.shims for p in status.passes]


@dataclass
class ServeCase:
    model: str
    label: str
    ft_args: list[str]
    context: int
    decode_steps: int
    jobs: int
    expects_wait: bool
    runs: dict[str, ServeRun]
    env: Environment | None = None


@dataclass
class ServeRecord:
    """``bench serve``: every arm in a real ``ft serve``, through a cache rebuild."""

    kind: ClassVar[str] = "serve"
    cases: list[ServeCase]


class Record(Protocol):
    """Any benchmark's record: a dataclass whose ``kind`` names its benchmark (``registry``)."""

    kind: ClassVar[str]
