"""decide(): the per-graph decision depends only on the mode and what the graph holds."""

from __future__ import annotations

import itertools
import random

import pytest

from freetoken_graphfix.config import Mode
from freetoken_graphfix.decide import Action, decide
from freetoken_graphfix.detect import Release, Wait

PLE = ("PLE wait-sync", Release.AFTER_LAUNCH, True)
ENGRAM = ("Engram wait-sync", Release.BEFORE_LAUNCH, False)
UNKNOWN = ("unknown (x.y)", Release.AFTER_LAUNCH, False)


def waits(*kinds):
    return [Wait(object(), object(), k, r, d) for k, r, d in kinds]


@pytest.mark.parametrize("mode, kinds, defer, expected", [
    (Mode.AUTO, [], None, Action.NOOP),
    (Mode.AUTO, [ENGRAM], None, Action.NOOP),
    (Mode.AUTO, [PLE], None, Action.DEFERRED),
    (Mode.AUTO, [PLE], "no replay hook", Action.WARM),
    (Mode.AUTO, [PLE, UNKNOWN], None, Action.WARM),
    (Mode.AUTO, [UNKNOWN], None, Action.WARM),
    (Mode.DEFERRED, [PLE, ENGRAM], None, Action.DEFERRED),
    (Mode.DEFERRED, [UNKNOWN], None, Action.WARM),
    (Mode.WARM, [PLE], None, Action.WARM),
    (Mode.WARM, [ENGRAM], None, Action.NOOP),
    (Mode.SKIP, [PLE], None, Action.EXPOSED),
    (Mode.SKIP, [], None, Action.NOOP),
    (Mode.UPLOAD, [], None, Action.UPLOAD),
    (Mode.UPLOAD, [PLE], None, Action.UPLOAD),
])
def test_decision_table(mode, kinds, defer, expected):
    assert decide(mode, waits(*kinds), defer_unavailable=defer).action is expected


def test_same_graph_same_decision_on_every_rank():
    """Fresh objects (other flags, other owners, as on another rank), any order: same decision."""
    kinds = [PLE, ENGRAM, UNKNOWN]
    rng = random.Random(0)
    for mode in (m for m in Mode if m is not Mode.OFF):
        for n in range(4):
            for combo in itertools.combinations_with_replacement(kinds, n):
                first = decide(mode, waits(*combo))
                for _ in range(5):
                    shuffled = list(combo)
                    rng.shuffle(shuffled)
                    assert decide(mode, waits(*shuffled)) == first


def test_reasons_name_what_blocks_deferral():
    d = decide(Mode.DEFERRED, waits(PLE, UNKNOWN))
    assert d.reason == "PLE wait-sync, unknown (x.y); cannot defer unknown (x.y)"
    assert decide(Mode.AUTO, waits(PLE), defer_unavailable="GraphRunner.replay(self, batch) not found").reason == (
        "PLE wait-sync; deferred unavailable: GraphRunner.replay(self, batch) not found")
