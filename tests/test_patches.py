"""The patch series on real FreeToken 0.2.0 and 0.2.1 sources (PyPI wheels), as a checkout and as an
install: check, apply, double apply, revert byte for byte, a modified target; then the patched 0.2.1
behaves like the shim."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from freetoken_graphfix import patching
from freetoken_graphfix.errors import PatchError

ROOT = Path(__file__).resolve().parents[1]


def digest(tree: Path) -> dict[str, str]:
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file()}


@pytest.fixture(params=["0.2.0", "0.2.1"])
def version(request):
    return request.param


@pytest.fixture(params=["repo", "site"])
def target(request, version, freetoken_tree, tmp_path):
    tree = freetoken_tree(version)
    if request.param == "repo":  # FreeToken's repository layout, as a git checkout
        checkout = tmp_path / "FreeToken"
        (checkout / "python").mkdir(parents=True)
        shutil.move(str(tree / "freetoken"), checkout / "python" / "freetoken")
        subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
        return patching.repo_target(checkout), checkout / "python" / "freetoken"
    return patching.Target(tree, 2, f"installed FreeToken at {tree / 'freetoken'}"), tree / "freetoken"


def test_series_file_lists_every_patch():
    names = [p.name for p in series_files()]
    assert names == sorted(p.name for p in (ROOT / "patches").glob("*.patch"))
    for patch in series_files():
        text = patch.read_text()
        for field in ("Description:", "Origin:", "Bug:", "Forwarded:", "Last-Update:"):
            assert field in text, (patch.name, field)


def series_files():
    return patching.series()


def test_apply_double_apply_revert(target):
    tgt, package = target
    original = digest(package)
    assert patching.state(tgt) == "not applied"
    assert patching.apply(tgt).startswith("applied 3 patches")
    patched = digest(package)
    assert patched != original and patching.state(tgt) == "applied"
    changed = {k for k in original if original[k] != patched[k]}
    assert changed == {"kernel/row_store.py", "models/deepseek_v41/engram_table.py", "engine/graph.py"}
    assert "already applied" in patching.apply(tgt)
    assert digest(package) == patched
    assert patching.revert(tgt).startswith("reverted 3 patches")
    assert digest(package) == original  # byte for byte
    assert "not applied" in patching.revert(tgt)


def test_modified_target_is_refused_untouched(target):
    tgt, package = target
    graph = package / "engine" / "graph.py"
    graph.write_text(graph.read_text().replace("import gc\n", "import gc  # local change\n"))
    before = digest(package)
    with pytest.raises(PatchError) as err:
        patching.apply(tgt)
    message = str(err.value)
    assert "matches neither the original nor the patched sources" in message
    assert "graph.py:" in message and "patch failed" in message and message.endswith("nothing was changed")
    assert digest(package) == before


def test_cli_patch_repo_and_missing_layout(tmp_path, freetoken_tree):
    tree = freetoken_tree("0.2.1")
    (tmp_path / "co" / "python").mkdir(parents=True)
    shutil.move(str(tree / "freetoken"), tmp_path / "co" / "python" / "freetoken")
    run = lambda *a: subprocess.run([sys.executable, "-m", "freetoken_graphfix", "patch", *a],  # noqa: E731
                                    capture_output=True, text=True)
    out = run("check", "--repo", str(tmp_path / "co"))
    assert out.returncode == 0 and out.stdout.strip().endswith(": not applied")
    out = run("apply", "--repo", str(tmp_path / "co"))
    assert out.returncode == 0 and "applied 3 patches" in out.stdout
    bad = run("check", "--repo", str(tmp_path))
    assert bad.returncode == 1 and "no python/freetoken/ in it" in bad.stderr


def test_site_points_at_the_installed_freetoken():
    import freetoken

    tgt = patching.site_target()
    assert tgt.root == Path(freetoken.__file__).resolve().parents[1] and tgt.strip == 2


def patched_child(tree: Path, shim_mode: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FT_GRAPH_UPLOAD", "FREETOKEN_GRAPH_UPLOAD")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(ROOT)])
    if shim_mode:
        env["FT_GRAPH_UPLOAD"] = shim_mode
    out = subprocess.run([sys.executable, "-m", "tests.patched_run"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def patched_021(tmp_path_factory, freetoken_tree):
    tree = freetoken_tree("0.2.1")
    patching.apply(patching.Target(tree, 2, "test tree"))
    return tree


def test_patched_freetoken_decides_like_the_shim(patched_021):
    """FREETOKEN_GRAPH_UPLOAD in the patched 0.2.1, shim not installed: auto protects only the PLE
    wait-sync graphs (as the shim's upload protection), always = upload, never = skip, warm = warm."""
    r = patched_child(patched_021, None)
    assert r["freetoken_file"].startswith(str(patched_021)) and r["shim"] is None
    assert r["auto/wait"] == {"uploaded": [True, True], "launches": [0, 0], "flag": 0}
    assert r["auto/none"] == {"uploaded": [False, False], "launches": [0, 0], "flag": 0}
    assert r["always/wait"]["uploaded"] == [True, True] and r["always/none"]["uploaded"] == [True, True]
    assert r["never/wait"] == {"uploaded": [False, False], "launches": [0, 0], "flag": 0}
    assert r["warm/wait"] == {"uploaded": [False, False], "launches": [1, 1], "flag": 0}
    assert r[" WARM /wait"] == r["warm/wait"] and r["warm/none"]["launches"] == [0, 0]
    assert r["bogus/wait"] == {"error": "unknown FREETOKEN_GRAPH_UPLOAD='bogus'; expected auto, always, never or warm"}


def test_shim_stands_down_on_patched_freetoken(patched_021):
    r = patched_child(patched_021, "auto")
    assert r["shim"]["patched"] is False and r["shim"]["upload_wrapped"] == "function"
    assert "carries the graph-upload patch series" in r["shim"]["reason"] and "stands down" in r["shim"]["reason"]
    assert r["auto/wait"]["uploaded"] == [True, True]  # FreeToken's own auto did the work
