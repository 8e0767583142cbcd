"""GPU, in a child with FreeToken 0.1.3 first on ``PYTHONPATH``: its real ``GraphRunner``,
``DiskRowTable`` (``_ple_store``) and replay on the device, through the bench rig (10,000 kernels
behind the PLE WAIT, a size where 0.2.x blocks), per mode. Prints one JSON line.

``python -m tests.children.run_freetoken_013_gpu``: 0.1.3's smallest real pieces that run on a GPU beside a newer torch.
"""

import json

import torch

STEPS = [(2, 11), (1, 12), (2, 13), (1, 14)]  # (bs, seed): first launches first


def run(mode, sync="wait"):
    import freetoken_graphfix
    from freetoken_graphfix_bench.rig.pieces import Rig

    freetoken_graphfix.uninstall()  # importing the package armed it
    if mode is not None:
        freetoken_graphfix.install(mode)
    rig = Rig(kernels=10000, streams=1, sync=sync)
    runner = rig.capture((1, 2))
    steps = [rig.step(runner, bs, seed, watchdog_s=3.0) for bs, seed in STEPS]
    passes = freetoken_graphfix.status()["passes"]
    freetoken_graphfix.uninstall()
    return steps, [g["action"] for g in passes[-1]["graphs"]] if passes and mode else []


def main():
    from freetoken.version import __version__

    gate, _ = run(None, sync="gate")  # FreeToken's own escape hatch: no WAIT, fill before the launch
    out = {"freetoken": __version__, "gpu": torch.cuda.get_device_name()}
    for mode in (None, "auto", "warm", "upload"):
        steps, actions = run(mode)
        same = [bool(torch.equal(s.logits, g.logits)) for s, g in zip(steps, gate, strict=True)]
        out[str(mode)] = {"fired": [s.fired for s in steps], "launch_ms": [round(s.launch_ms, 2) for s in steps],
                          "actions": actions, "logits_equal_gate": same}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
