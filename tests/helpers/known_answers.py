"""Rig records of a known answer, in exactly the shape ``bench rig --json`` writes (``rig.measure``):
12 instances a mode, the instances' own medians a known spread apart, the upload slower (or faster)
by a known amount, and the positive control's spin of known GPU time."""

from __future__ import annotations

import random
from typing import Any

from freetoken_graphfix_bench import record_files, records, registry
from freetoken_graphfix_bench.verdicts import CONTROL_ADDED

ACTIONS = {"upload": "upload", "skip": "exposed", "warm": "warm", "deferred": "deferred", "auto": "deferred",
           "control": "exposed"}


def rig_record(cost: float, apart: float, seed: int, *, instances: int = 12, reps: int = 15,
               base_us: float = 550.0, control_read: float = CONTROL_ADDED, bs_list: tuple[str, ...] = ("2", "1"),
               arms: tuple[str, ...] = tuple(ACTIONS)) -> records.RigRecord:
    """Each instance's replays sit around its own median, drawn so that the instances of one arm lie
    about ``apart`` (max - min, relative) apart; ``upload`` is ``1 + cost`` times slower, the control
    its spin's recorded GPU time ``CONTROL_ADDED`` of the bs-1 step, read as ``control_read``."""
    rng = random.Random(seed)
    sd = apart / 3.3  # 12 normal draws span about 3.3 standard deviations
    # the spin's own time: CONTROL_ADDED of the smallest bs's step (so the largest fraction of any)
    spin_us = CONTROL_ADDED * base_us * (1 + 0.1 * min(map(int, bs_list)))

    def step_us(name: str, bs: str) -> float:
        step = base_us * (1 + 0.1 * int(bs))
        if name == "control":
            return step + spin_us * control_read / CONTROL_ADDED
        return step * (1 + cost) if name == "upload" else step

    def arm(name: str) -> dict[str, Any]:
        replay = {}
        for bs in bs_list:
            step = step_us(name, bs)
            medians = [step * (1 + rng.gauss(0, sd)) for _ in range(instances)]
            replay[bs] = [[m * (1 + rng.gauss(0, 0.002)) for _ in range(reps)] for m in medians]
        return {"capture_s": [0.1] * instances,
                "graphs": {f"bs={bs}": {"action": [ACTIONS[name]] * instances, "hook_ms": [0.1] * instances}
                           for bs in bs_list},
                "first_launch": {bs: {"launch_ms": [2.0] * instances, "blocked": [False] * instances}
                                 for bs in bs_list},
                "replay_us": replay, "logits_equal_upload": True, "gaps_us": {}}

    record = {"kind": "rig", "schema": records.SCHEMA,
              "env": {"gpu": "GPU", "driver": "1", "torch": "2", "freetoken": "0.2.1", "date": "today"},
              "config": {"kernels": 1090, "streams": 4, "no_wait": False, "h2d": False,
                         "batch_sizes": [int(b) for b in bs_list], "instances": instances, "reps": reps,
                         "profile_reps": 0, "watchdog": 4.0, "modes": [a for a in arms if a != "control"]},
              "arms": {name: arm(name) for name in arms}, "command": "freetoken-graphfix bench rig"}
    if "control" in arms:
        record["control"] = {"spin_us": spin_us, "spin_cycles": 0}
    return record_files.from_data(record, registry.kinds())
