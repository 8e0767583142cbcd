"""install()/uninstall() against the real FreeToken: import orders, exact restore, version gating."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import wrapt

import freetoken_graphfix

REPORT = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
{imports}
import freetoken.engine.graph as g, freetoken_graphfix, torch
print(json.dumps({{"upload": type(vars(g).get("_upload_graph")).__name__,
                  "status": freetoken_graphfix.status(), "cuda": torch.cuda.is_initialized()}}))
"""


def run_child(imports: str, env: dict | None = None, pythonpath: str | None = None) -> tuple[dict, str]:
    env = {**{k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}, **(env or {})}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, "-c", REPORT.format(imports=textwrap.dedent(imports))],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


INSTALL = "import freetoken_graphfix\nfreetoken_graphfix.install()"


@pytest.mark.parametrize("imports", [
    f"{INSTALL}\nimport freetoken.engine.graph",
    f"import freetoken.engine.graph\n{INSTALL}",
])
def test_both_import_orders_patch(imports):
    report, _ = run_child(imports)
    assert report["upload"] == "FunctionWrapper"
    assert report["status"]["patched"] and report["status"]["mode"] == "auto"
    assert report["cuda"] is False  # Engine.__init__ asserts CUDA is uninitialised (engine.py 408)


def test_importing_the_package_alone_patches_nothing():
    """Only ``install()`` (or the ``.pth``, with the variable set) turns the shim on: a tool imports it freely."""
    report, log = run_child("import freetoken_graphfix\nimport freetoken_graphfix.shim")
    assert report["upload"] == "function" and not report["status"]["patched"] and not report["status"]["installed"]
    assert "freetoken_graphfix" not in log


def test_import_does_not_import_torch():
    code = "import sys, freetoken_graphfix; print('torch' in sys.modules, 'freetoken' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_install_uninstall_idempotent_and_exact(clean_shim, caplog):
    import freetoken.engine.graph as graph
    import freetoken.kernel.row_store as row_store

    originals = (vars(graph)["_upload_graph"], vars(row_store)["wait_reset"],
                 vars(graph.GraphRunner)["_capture_graphs"])
    freetoken_graphfix.uninstall()  # before install: nothing to do
    freetoken_graphfix.install("auto")
    with caplog.at_level(logging.DEBUG, "freetoken_graphfix"):
        freetoken_graphfix.install("auto")  # the same mode again: nothing to do
    assert freetoken_graphfix.status()["mode"] == "auto" and freetoken_graphfix.status()["mode_changes"] == []
    assert "already installed in mode auto" in caplog.text
    wrapped = (vars(graph)["_upload_graph"], vars(row_store)["wait_reset"], vars(graph.GraphRunner)["_capture_graphs"])
    assert all(isinstance(w, wrapt.FunctionWrapper) for w in wrapped)
    assert [w.__wrapped__ for w in wrapped] == list(originals)
    freetoken_graphfix.uninstall()
    freetoken_graphfix.uninstall()
    restored = (vars(graph)["_upload_graph"], vars(row_store)["wait_reset"], vars(graph.GraphRunner)["_capture_graphs"])
    assert all(r is o for r, o in zip(restored, originals, strict=True))
    freetoken_graphfix.install("skip")  # install -> uninstall -> install
    assert isinstance(vars(graph)["_upload_graph"], wrapt.FunctionWrapper)
    assert freetoken_graphfix.status()["mode"] == "skip"


def test_uninstall_leaves_a_repatch_on_top_alone(clean_shim, caplog):
    """Someone patched _upload_graph over the shim's wrapper: uninstall() restores the rest and
    leaves theirs in place (putting FreeToken's original back would silently drop their patch)."""
    import freetoken.engine.graph as graph
    import freetoken.kernel.row_store as row_store

    original_upload, original_wait_reset = vars(graph)["_upload_graph"], vars(row_store)["wait_reset"]
    freetoken_graphfix.install("auto")

    def theirs(graph, stream):
        pass

    graph._upload_graph = theirs
    try:
        with caplog.at_level(logging.WARNING, "freetoken_graphfix"):
            freetoken_graphfix.uninstall()
        assert vars(graph)["_upload_graph"] is theirs
        assert vars(row_store)["wait_reset"] is original_wait_reset
        assert "_upload_graph was re-patched by someone else; left as it is" in caplog.text
    finally:
        graph._upload_graph = original_upload


def test_mode_exported_for_children(clean_shim, monkeypatch):
    monkeypatch.delenv("FT_GRAPH_UPLOAD", raising=False)
    freetoken_graphfix.install()
    assert os.environ["FT_GRAPH_UPLOAD"] == "auto"
    freetoken_graphfix.uninstall()
    assert "FT_GRAPH_UPLOAD" not in os.environ  # restored as found
    monkeypatch.setenv("FT_GRAPH_UPLOAD", " WARM ")
    freetoken_graphfix.install()
    assert freetoken_graphfix.status()["mode"] == "warm" and os.environ["FT_GRAPH_UPLOAD"] == "warm"


def test_off_patches_nothing(clean_shim, monkeypatch):
    import freetoken.engine.graph as graph

    for value in ("off", "0", "FALSE"):
        monkeypatch.setenv("FT_GRAPH_UPLOAD", value)
        freetoken_graphfix.install()
        assert not isinstance(vars(graph)["_upload_graph"], wrapt.FunctionWrapper)
        st = freetoken_graphfix.status()
        assert (st["mode"], st["patched"], st["reason"]) == ("off", False, f"disabled (FT_GRAPH_UPLOAD={value!r})")
        freetoken_graphfix.uninstall()


@pytest.mark.parametrize("value", ["bogus", "uploaded", "on", "1"])
def test_bad_env_value_is_a_clear_error(clean_shim, monkeypatch, value):
    import freetoken.engine.graph as graph

    monkeypatch.setenv("FT_GRAPH_UPLOAD", value)
    with pytest.raises(freetoken_graphfix.ConfigError) as err:
        freetoken_graphfix.install()
    assert str(err.value) == (f"FT_GRAPH_UPLOAD={value!r} is not a valid mode; accepted values: "
                              "auto, upload, skip, warm, deferred, off, 0, false")
    assert not isinstance(vars(graph)["_upload_graph"], wrapt.FunctionWrapper)  # nothing patched
    assert os.environ["FT_GRAPH_UPLOAD"] == value  # and nothing lost


def test_bad_mode_argument(clean_shim):
    with pytest.raises(freetoken_graphfix.ConfigError, match=r"^mode='fast' is not a valid mode; accepted"):
        freetoken_graphfix.install("fast")


def test_bad_env_value_at_start_up():
    """The ``.pth`` never raises (an import hook must not break FreeToken's import): once
    FreeToken is imported, one ERROR line names the variable, the value and the accepted values, and
    FreeToken keeps its own upload."""
    code = ("import freetoken_graphfix, json; import freetoken.engine.graph as g; "
            "print(json.dumps([type(vars(g)['_upload_graph']).__name__, freetoken_graphfix.status()['reason']]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "FT_GRAPH_UPLOAD": "sometimes"})
    assert proc.returncode == 0, proc.stderr
    message = ("FT_GRAPH_UPLOAD='sometimes' is not a valid mode; accepted values: auto, upload, skip, warm, "
               "deferred, off, 0, false; FreeToken left untouched (its own upload)")
    lines = proc.stderr.strip().splitlines()  # through the .pth's handler: the variable is set
    assert len(lines) == 1 and lines[0].endswith(f"ERROR not patched: {message}"), proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["function", message]


def test_other_signature_refused(clean_shim, monkeypatch, caplog):
    import freetoken.engine.graph as graph

    def _upload_graph(graph, stream, *, sync=True):  # a future FreeToken
        pass

    monkeypatch.setattr(graph, "_upload_graph", _upload_graph)
    with caplog.at_level(logging.INFO, "freetoken_graphfix"):
        freetoken_graphfix.install("auto")
    assert vars(graph)["_upload_graph"] is _upload_graph
    st = freetoken_graphfix.status()
    assert not st["patched"] and "changed _upload_graph to ['graph', 'stream', 'sync']" in st["reason"]
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_missing_wait_reset_refused(clean_shim, monkeypatch):
    import freetoken.engine.graph as graph
    import freetoken.kernel.row_store as row_store

    monkeypatch.delattr(row_store, "wait_reset")
    freetoken_graphfix.install("auto")
    assert not isinstance(vars(graph)["_upload_graph"], wrapt.FunctionWrapper)
    assert "lacks freetoken.kernel.row_store.wait_reset(stream, flag)" in freetoken_graphfix.status()["reason"]


def test_a_wait_function_of_another_signature_is_refused(clean_shim, monkeypatch, caplog):
    """A FreeToken whose wait_reset changed its parameters: the hook would record the wrong argument
    as the flag, so the shim does not patch at all, with a WARNING naming what it expected."""
    import freetoken.engine.graph as graph
    import freetoken.kernel.row_store as row_store

    def wait_reset(flag, stream, value=1):  # a future FreeToken
        pass

    monkeypatch.setattr(row_store, "wait_reset", wait_reset)
    with caplog.at_level(logging.INFO, "freetoken_graphfix"):
        freetoken_graphfix.install("auto")
    assert not isinstance(vars(graph)["_upload_graph"], wrapt.FunctionWrapper)
    assert vars(row_store)["wait_reset"] is wait_reset
    assert "lacks freetoken.kernel.row_store.wait_reset(stream, flag)" in freetoken_graphfix.status()["reason"]
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_failure_midway_leaves_nothing_patched(clean_shim, monkeypatch):
    import freetoken.engine.graph as graph
    import freetoken.kernel.row_store as row_store

    original = vars(graph)["_upload_graph"]
    real_wrap = wrapt.wrap_function_wrapper

    def flaky(owner, name, wrapper):
        if name == "_capture_graphs":
            raise RuntimeError("simulated")
        return real_wrap(owner, name, wrapper)

    monkeypatch.setattr(wrapt, "wrap_function_wrapper", flaky)
    freetoken_graphfix.install("auto")
    assert vars(graph)["_upload_graph"] is original
    assert not isinstance(vars(row_store)["wait_reset"], wrapt.FunctionWrapper)
    assert "patching failed" in freetoken_graphfix.status()["reason"]


def test_freetoken_013_is_patched_with_one_info_line(freetoken_tree):
    """0.1.3 has no upload, but the same WAIT: patched (its WAITs seen through _ple_store), and the
    only line the shim prints in process is the one INFO line the README promises."""
    report, log = run_child(INSTALL, pythonpath=str(freetoken_tree("0.1.3")))
    st = report["status"]
    assert st["freetoken"]["version"] == "0.1.3" and st["freetoken"]["tested"] and report["upload"] == "NoneType"
    assert st["patched"] and st["deferred"]["available"]
    shim_lines = [line for line in log.splitlines() if "freetoken_graphfix" in line]
    assert shim_lines == ["INFO freetoken_graphfix patched (mode auto): freetoken 0.1.3 has no capture-time upload "
                          "at all"]


def test_freetoken_012_has_nothing_to_protect(freetoken_tree):
    report, log = run_child(INSTALL, pythonpath=str(freetoken_tree("0.1.2")))
    st = report["status"]
    assert st["freetoken"]["version"] == "0.1.2" and not st["patched"]
    shim_lines = [line for line in log.splitlines() if "freetoken_graphfix" in line]
    assert shim_lines == ["INFO freetoken_graphfix not patched: freetoken 0.1.2: no host-released WAIT in this "
                          "release (no disk PLE table): nothing to protect"]


@pytest.mark.parametrize("version", ["0.2.9", "0.2.1.post1", "0.2.1+local"])
def test_an_untested_release_is_decided_by_feature(clean_shim, monkeypatch, caplog, version):
    """Another release, a post-release or a local build of a tested one alike: none of them is what
    the tests ran against, so each gets the WARNING that names what was checked."""
    import freetoken.engine.graph  # noqa: F401  (the install completes on FreeToken's import)

    from freetoken_graphfix import compat

    monkeypatch.setattr(compat, "freetoken_version", lambda: version)
    with caplog.at_level(logging.INFO, "freetoken_graphfix"):
        freetoken_graphfix.install("auto")
    st = freetoken_graphfix.status()
    assert st["patched"] and st["freetoken"]["tested"] is False and st["deferred"]["available"]
    assert st["reason"] == (
        f"freetoken {version} holds the capture-time upload (untested release, decided by feature: found "
        "GraphRunner._capture_graphs, freetoken.kernel.row_store.wait_reset, _upload_graph(graph, stream); "
        "deferred path: every private detail found)")
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_an_untested_release_without_a_private_detail_gets_no_deferral(clean_shim, monkeypatch):
    """A release whose host_fill_batch no longer returns the deferred fill: the guard could not see
    the fill, so the deferred path is off (warm instead), and the reason says which detail."""
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    from freetoken_graphfix import compat

    def host_fill_batch(self, batch, use_graph):
        return None

    monkeypatch.setattr(compat, "freetoken_version", lambda: "0.2.9")
    monkeypatch.setattr(DiskRowTable, "host_fill_batch", host_fill_batch)
    freetoken_graphfix.install("auto")
    st = freetoken_graphfix.status()
    assert st["patched"] and not st["deferred"]["available"]
    assert st["deferred"]["reason"] == "missing DiskRowTable.host_fill_batch returns the deferred fill"
    assert "deferred path: missing DiskRowTable.host_fill_batch returns the deferred fill" in st["reason"]


def test_an_untested_release_whose_lookup_waits_on_something_else_gets_no_deferral(clean_shim, monkeypatch):
    """The guard releases the table's ``_flag``: a release whose lookup no longer waits on it must not
    get the deferred path (warm instead), the reason naming the detail."""
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    from freetoken_graphfix import compat

    def lookup(self, row_ids, out=None):
        return self._other_sync.wait(row_ids)

    monkeypatch.setattr(compat, "freetoken_version", lambda: "0.2.9")
    monkeypatch.setattr(DiskRowTable, "lookup", lookup)
    freetoken_graphfix.install("auto")
    st = freetoken_graphfix.status()
    assert st["patched"] and not st["deferred"]["available"]
    assert st["deferred"]["reason"] == "missing DiskRowTable.lookup waits on self._flag"


@pytest.mark.parametrize("version", ["unknown", "0.2.1-dirty-tree"])
def test_a_release_of_no_valid_version_is_an_untested_one(clean_shim, monkeypatch, caplog, version):
    """A dev tree or a missing version file: not one of the tested releases, so the WARNING that
    lists what was checked, not the INFO line of a tested one."""
    import freetoken.engine.graph  # noqa: F401

    from freetoken_graphfix import compat

    monkeypatch.setattr(compat, "freetoken_version", lambda: version)
    with caplog.at_level(logging.INFO, "freetoken_graphfix"):
        freetoken_graphfix.install("auto")
    st = freetoken_graphfix.status()
    assert st["freetoken"]["tested"] is False and "untested release, decided by feature" in st["reason"]
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_freetoken_020_is_patched(freetoken_tree):
    report, _ = run_child(INSTALL, pythonpath=str(freetoken_tree("0.2.0")))
    st = report["status"]
    assert st["freetoken"]["version"] == "0.2.0" and st["patched"] and st["freetoken"]["tested"]
    assert report["upload"] == "FunctionWrapper" and st["deferred"]["available"]


def test_install_switches_the_mode_of_an_installed_shim(install, fake, engine, caplog):
    """install(mode) on an installed shim: graphs captured from then on get the new mode, graphs
    already captured keep their decision, and status() says so."""
    from tests.helpers import harness

    _, model = engine
    install("auto")
    harness.make_runner(model, fake.default)
    with caplog.at_level(logging.INFO, "freetoken_graphfix"):
        freetoken_graphfix.install("warm")
    harness.make_runner(model, fake.default)
    st = freetoken_graphfix.status()
    assert st["mode"] == "warm" and os.environ["FT_GRAPH_UPLOAD"] == "warm"
    assert [[g["action"] for g in p["graphs"]] for p in st["passes"]] == [["deferred"] * 2, ["warm"] * 2]
    change = "auto -> warm: graphs captured from now on; the 2 captured before keep their decisions"
    assert st["mode_changes"] == [change] and f"mode {change}" in caplog.text


def test_each_install_keeps_its_own_record(install, fake, engine):
    """The shim's state is the object install() makes: uninstall() leaves its record readable, a new
    install starts a record of its own and wraps FreeToken with its own methods, and a switch through
    off (an uninstall and install inside) carries the record on."""
    from freetoken.engine import graph

    from freetoken_graphfix import shim
    from tests.helpers import harness

    _, model = engine
    install("auto")
    first = shim.latest
    harness.make_runner(model, fake.default)
    freetoken_graphfix.install("off")
    freetoken_graphfix.install("warm")
    harness.make_runner(model, fake.default)
    assert [[g["action"] for g in p["graphs"]] for p in freetoken_graphfix.status()["passes"]] == [
        ["deferred"] * 2, ["warm"] * 2]
    assert vars(graph)["_upload_graph"]._self_wrapper.__self__ is shim.latest is not first
    freetoken_graphfix.uninstall()
    assert len(freetoken_graphfix.status()["passes"]) == 2 and not first.installed
    install("skip")
    assert freetoken_graphfix.status()["passes"] == [] and shim.latest.passes == []


def test_install_bogus_on_an_installed_shim_changes_nothing(clean_shim):
    freetoken_graphfix.install("deferred")
    with pytest.raises(freetoken_graphfix.ConfigError, match=r"^mode='bogus' is not a valid mode; accepted values"):
        freetoken_graphfix.install("bogus")
    assert freetoken_graphfix.status()["mode"] == "deferred" and freetoken_graphfix.status()["patched"]


def test_switching_to_off_and_back(clean_shim):
    import freetoken.engine.graph as graph

    original = vars(graph)["_upload_graph"]
    freetoken_graphfix.install("auto")
    freetoken_graphfix.install("off")
    assert vars(graph)["_upload_graph"] is original and freetoken_graphfix.status()["mode"] == "off"
    freetoken_graphfix.install("skip")
    assert isinstance(vars(graph)["_upload_graph"], wrapt.FunctionWrapper)
    assert freetoken_graphfix.status()["mode_changes"][-2:] == [
        "auto -> off: graphs captured from now on; the 0 captured before keep their decisions",
        "off -> skip: graphs captured from now on; the 0 captured before keep their decisions"]


def test_a_switch_keeps_the_device_and_timeout_unless_given(install, fake):
    """install(mode) on an installed shim keeps the device and warm timeout it was installed with,
    also through off (a new install inside), and takes new ones when the switch names them."""
    from freetoken_graphfix import shim

    install("auto", warm_timeout_s=0.25)
    freetoken_graphfix.install("off")
    freetoken_graphfix.install("warm")
    assert shim.latest.device is fake and shim.latest.warm_timeout_s == 0.25
    other = type(fake)()
    freetoken_graphfix.install("deferred", device=other, warm_timeout_s=0.5)
    assert shim.latest.device is other and shim.latest.warm_timeout_s == 0.5
    freetoken_graphfix.install("off", device=fake)
    freetoken_graphfix.install("auto")
    assert shim.latest.device is fake and shim.latest.warm_timeout_s == 0.5


def test_status_after_uninstall_tells_the_truth(clean_shim):
    freetoken_graphfix.install("auto")
    assert freetoken_graphfix.status()["deferred"]["available"]
    freetoken_graphfix.uninstall()
    st = freetoken_graphfix.status()
    assert (st["installed"], st["patched"], st["mode"], st["reason"]) == (False, False, None, "not installed")
    assert st["deferred"]["available"] is False and st["deferred"]["reason"] is None
    assert st["freetoken"]["version"] == "0.2.1" and st["freetoken"]["path"] is None


def test_status_before_freetoken_import():
    code = "import json, freetoken_graphfix as f; f.install(); print(json.dumps(f.status()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    st = json.loads(out.stdout)
    assert st["installed"] and not st["patched"]
    assert st["reason"] == "waiting for freetoken.engine.graph to be imported"
    assert st["freetoken"]["version"] == "0.2.1"


def test_install_at_freetokens_import_imports_no_more_of_freetoken():
    """The hook runs inside FreeToken's import of engine.graph, in every ft serve process, before the
    engine has its device: it must not import any of FreeToken that FreeToken does not import there
    itself (the row store pulls in ``freetoken.kernel``'s triton kernels and its extension)."""
    code = ("import sys; import freetoken.engine.graph; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('freetoken.'))))")

    def modules(value):
        env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
        if value:
            env["FT_GRAPH_UPLOAD"] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return set(out.stdout.split())

    extra = modules("auto") - modules(None)
    assert extra == set(), extra


def test_arming_loads_only_what_the_install_runs():
    """Every FreeToken process pays for the modules the install imports (docs/measurements.md, "Arming"): what runs
    only at a capture (detect, decide, deferred, warm, the status records) is imported there."""
    code = ("import sys; import freetoken.engine.graph; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('freetoken_graphfix'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "FT_GRAPH_UPLOAD": "auto"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"freetoken_graphfix{m}" for m in ("", ".bootstrap", ".capture", ".compat", ".config",
                                                                      ".device", ".errors", ".shim")]


def test_the_wait_function_is_wrapped_once_freetoken_imports_it():
    """Patched at engine.graph's import, the WAIT function is wrapped when FreeToken itself imports its
    module, not before."""
    code = ("import sys, json, wrapt, freetoken_graphfix; freetoken_graphfix.install(); import freetoken.engine.graph; "
            "before = 'freetoken.kernel.row_store' in sys.modules; import freetoken.kernel.row_store as rs; "
            "print(json.dumps([before, isinstance(vars(rs)['wait_reset'], wrapt.FunctionWrapper), "
            "freetoken_graphfix.status()['patched']]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, True, True]


def test_a_wait_function_found_changed_at_its_import_stands_the_shim_down(freetoken_tree):
    """A release whose source defines wait_reset(stream, flag) but whose module, as imported, holds
    another: once FreeToken imports it, the shim unwraps everything (FreeToken's own upload is back)
    and says why in one WARNING; no graph could have held that WAIT before."""
    tree = freetoken_tree("0.2.1")
    row_store = tree / "freetoken" / "kernel" / "row_store.py"
    row_store.write_text(row_store.read_text() + "\n_real = wait_reset\n\n\ndef wait_reset(flag, stream, value=1):"
                         "\n    return _real(stream, flag)\n")
    code = ("import json, logging, sys, wrapt, freetoken_graphfix; freetoken_graphfix.install(); "
            "logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(levelname)s %(message)s'); "
            "import freetoken.engine.graph as g; patched = freetoken_graphfix.status()['patched']; "
            "import freetoken.kernel.row_store; st = freetoken_graphfix.status(); "
            "print(json.dumps([patched, type(vars(g)['_upload_graph']).__name__, st['patched'], st['reason']]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**{k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"},
                              "PYTHONPATH": str(tree)})
    assert out.returncode == 0, out.stderr
    before, upload, after, reason = json.loads(out.stdout.strip().splitlines()[-1])
    assert (before, upload, after) == (True, "function", False)
    assert reason == ("freetoken 0.2.1 lacks freetoken.kernel.row_store.wait_reset(stream, flag): the shim cannot see "
                      "which graphs hold a host-released WAIT; FreeToken left untouched")
    assert [ln.split()[0] for ln in out.stderr.splitlines() if ln.startswith(("INFO", "WARNING"))][-1] == "WARNING"
