"""The bootstrap .pth lands at the root of site-packages for regular and editable installs alike."""

from __future__ import annotations

import zipfile
from pathlib import Path

from freetoken_graphfix import bootstrap

ROOT = Path(__file__).resolve().parents[1]


def test_wheels_carry_the_pth_at_their_root(tmp_path):
    from hatchling.builders.wheel import WheelBuilder

    built = list(WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard", "editable"]))
    assert len(built) == 2
    source = (ROOT / "freetoken_graphfix" / "_bootstrap.pth").read_text()
    for wheel in built:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            assert bootstrap.PTH_NAME in names, (wheel, names)  # the root, not *.data/
            assert zf.read(bootstrap.PTH_NAME).decode() == source
