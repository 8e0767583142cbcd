"""Run in a child whose ``PYTHONPATH`` puts FreeToken 0.1.3 first: the shim on 0.1.3's real pieces.

``python -m tests.children.run_freetoken_013`` prints one JSON line: 0.1.3's real ``GraphRunner`` (no ``_upload_graph``
at all), ``DiskRowTable`` (wait-sync, ``_ple_store``) and ``Engine.forward_batch`` on the fake
device, whose large graphs block their first never-uploaded launch behind their WAIT. First
without the shim (the negative control), then in every mode, then the faults under ``auto``.
"""

import json
import logging
import tempfile

from tests.helpers.fault_rig import EngineRig


class Rig(EngineRig):
    def __init__(self, tmp: str, mode: str | None) -> None:
        import freetoken_graphfix

        freetoken_graphfix.uninstall()  # importing the package armed it: start from FreeToken as shipped
        self.mode = mode
        super().__init__(tmp)

    def arm(self) -> None:
        import freetoken_graphfix

        if self.mode is not None:
            freetoken_graphfix.install(self.mode, device=self.fake, warm_timeout_s=2.0)

    def close(self) -> None:
        import freetoken_graphfix

        freetoken_graphfix.uninstall()
        super().close()


def graphs(rig: Rig) -> list[dict]:
    return [{"uploaded": g.uploaded, "launches": g.launches} for g in (rig.runner.graph_map[bs] for bs in (4, 2, 1))]


def run_mode(mode: str | None) -> dict:
    from freetoken.engine.graph import GraphRunner
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    import freetoken_graphfix

    with tempfile.TemporaryDirectory() as tmp:
        rig = Rig(tmp, mode)
        try:
            out = {"at_capture": graphs(rig), "cache_resets": list(rig.cache.resets),
                   "steps": [rig.step(bs, seed, pad=bs == 3) for seed, bs in enumerate([2, 2, 1, 3, 1])]}
            st = freetoken_graphfix.status()
            out["passes"] = [[(g["name"], g["action"], g["first_launch"]) for g in p["graphs"]] for p in st["passes"]]
            out["reason"] = st["reason"]
            out["left_on_freetoken"] = sorted(
                [f"graph bs={bs}" for bs, g in rig.runner.graph_map.items() if "replay" in vars(g)]
                + (["table"] if "host_fill_batch" in vars(rig.table) else [])
                + [f"{c.__name__}.{n}" for c, n in ((GraphRunner, "replay"), (DiskRowTable, "host_fill_batch"))
                   if getattr(vars(c)[n], "__wrapped__", None) is not None])
            if mode != "auto":
                return out
            out["rebuild"] = rig.rebuild()
            out["rebuild_pass"] = [g["action"] for g in freetoken_graphfix.status()["passes"][-1]["graphs"]]
            rig.faults(out)
            out["last_pass"] = [(g["name"], g["first_launch"]) for g in freetoken_graphfix.status()["passes"][-1][
                "graphs"]]
            return out
        finally:
            rig.close()


def main() -> None:
    import freetoken.engine.graph as graph
    from freetoken.version import __version__

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(f"{r.levelname} {r.getMessage()}")  # type: ignore[method-assign]
    logging.getLogger("freetoken_graphfix").addHandler(handler)
    logging.getLogger("freetoken_graphfix").setLevel(logging.INFO)
    out = {"freetoken": __version__, "file": graph.__file__, "has_upload_graph": hasattr(graph, "_upload_graph")}
    for mode in (None, "auto", "deferred", "warm", "upload", "skip"):
        records.clear()
        out[str(mode)] = run_mode(mode)
        out[str(mode)]["log"] = list(records)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
