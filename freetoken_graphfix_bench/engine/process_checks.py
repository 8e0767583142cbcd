"""What makes one ``bench engine`` process no proof of anything (``problems``), and whether a case's
graphs held the host-released WAIT at all (``wait_case_of``). The safety targets over a case's arms are
``headline.failures``."""

from __future__ import annotations

from freetoken_graphfix import config

from ..arms import ARMS, GATE, expected_action
from ..records import EngineProcess


def holds_wait(r: EngineProcess) -> bool:
    """Whether this run's decode graphs held a WAIT the host releases after the launch: the disk PLE
    table in CUDA wait-sync mode, its WAIT captured (on HIP the fill worker releases it before the
    launch). The table's fill worker alone does not say HIP: the patch series creates it on CUDA too;
    records from before ``hip`` was recorded ran FreeToken's worker on HIP only."""
    hip = r.fill_worker if r.hip is None else r.hip
    return bool(r.wait_sync and r.captured_waits and not hip)


def wait_case_of(runs: dict[str, list[EngineProcess]]) -> bool:
    """Whether the model's graphs held a host-released WAIT in any run (gate's never do)."""
    return any(holds_wait(r) for arm, rs in runs.items() if arm != GATE for r in rs if r.ok)


def problems(arm: str, r: EngineProcess, wait_case: bool, expects_wait: bool = True) -> list[str]:
    """What makes this arm's run no proof of anything, whatever its figures say. ``wait_case``: the
    model's graphs hold a host-released WAIT (as found by the runs); ``expects_wait``: its config says
    they should."""
    out = _decoded(arm, r, wait_case, expects_wait)
    if r.replay_error is not None:
        out.append(f"timing the graphs' replays failed: {r.replay_error}")
    if r.copies_error is not None:
        out.append(r.copies_error + " (run with --copies 0)")
    return out + _freetoken_ran(arm, r) + _shim_ran(arm, r, wait_case)


def _decoded(arm: str, r: EngineProcess, wait_case: bool, expects_wait: bool) -> list[str]:
    """Whether the decode ran on the graphs the arm is about (with the WAIT, or without it for gate)."""
    graph_steps = r.steps.get("graph", 0)
    if arm == GATE:
        if r.wait_sync or r.captured_waits or graph_steps == 0:
            return [f"the gate arm did not decode on graphs without a WAIT (wait-sync {r.wait_sync}, "
                    f"{r.captured_waits} WAITs, steps {r.steps})"]
    elif expects_wait and not holds_wait(r):
        return [f"PLE table {r.table} is not in CUDA wait-sync mode: no WAIT to protect"]
    elif wait_case and (r.captured_waits < len(r.graph_bs) or graph_steps == 0):
        return [f"decode did not run on graphs holding the WAIT ({r.captured_waits} WAITs, steps {r.steps})"]
    elif graph_steps == 0:
        return [f"decode never ran on a CUDA graph (steps {r.steps}): nothing was measured"]
    return []


def _freetoken_ran(arm: str, r: EngineProcess) -> list[str]:
    """The patched arm ran the series; every other arm ran FreeToken as released."""
    if ARMS[arm].patched:
        return [] if r.freetoken_patched else [
            f"the engine did not run the patched FreeToken (it ran {r.freetoken_file})"]
    if r.freetoken_patched:
        return [f"the installed FreeToken carries the patch series, so the {arm} arm measures it, not 0.2.1: "
                "revert it (patch revert --site) and compare the series through the patched arms"]
    return []


def _shim_ran(arm: str, r: EngineProcess, wait_case: bool) -> list[str]:
    """A shim arm's shim reached its engine process in its mode and took its action on every graph; no
    other arm had the shim."""
    shim = r.shim
    mode = ARMS[arm].shim_mode
    if mode is None:
        if shim is not None and shim.installed:
            return [f"the shim was loaded in the {arm} arm ({config.ENV_MODE} leaked into its environment)"]
        return []
    if shim is None or shim.mode != mode.value or not shim.patched:
        return [f"the shim did not reach the engine process in mode {mode.value} "
                f"({'not loaded' if shim is None else shim.reason}): is freetoken-graphfix installed in "
                f"this interpreter's site-packages, so that its .pth bootstrap runs? see doctor"]
    want, actions = expected_action(arm, wait_case).value, r.shim_actions()
    return [] if set(actions) == {want} else [f"expected action {want} for every graph, got {actions}"]
