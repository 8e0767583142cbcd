"""Records written (``--json``) and read back (``bench report``): this module alone reads a record, of any
schema, and refuses what is none in one line naming the file and the field.

``migrate`` turns a record of an earlier schema (the first: no ``kind``, a bare rig or start-up object, a
list of engine or serve cases, or a GPU test's ``{"kind", "record", "code"}`` wrapper; the second: an
arm named ``pre-697``, a server's capture passes as actions and reasons) into the current shape;
``build`` then makes the typed record, field by field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from freetoken_graphfix import safe_files

from .arms import RENAMED
from .records import SCHEMA, Record

Kinds = Mapping[str, type]  # a record's kind -> its class: ``registry.kinds()``, passed down (this module is below it)


def accepted(kinds: Kinds) -> str:
    """The accepted values, for the line that refuses a file: the kinds of record a benchmark saves."""
    return "accepted values are a record a bench --json wrote (" + ", ".join(kinds) + ")"


class RecordError(ValueError):
    """A file that is no record this version can read; its message is one line."""


def to_data(record: Record) -> dict[str, Any]:
    """``record`` as JSON data: its kind and the schema first; a figure that could not be computed
    (nan, inf) as ``null``, so the file is strict JSON."""
    return {"kind": record.kind, "schema": SCHEMA, **finite(dataclasses.asdict(record))}


def write(path: str, record: Record) -> None:
    """A record as strict JSON (no NaN: ``to_data`` turns them into null), readable by any JSON tool."""
    safe_files.write_text(path, json.dumps(to_data(record), indent=1, allow_nan=False))


def finite(value: Any) -> Any:
    """NaN and infinities as null, all the way down: JSON has no word for them, and a record must stay strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


MAX_BYTES = 256 * 1024 * 1024  # the largest GPU record written here is under 2 MB
MAX_INSTANCES, MAX_REPLAYS = 10_000, 1_000_000  # bench rig's defaults are 12 and 300


def read(path: str, kinds: Kinds) -> Record:
    """The record in ``path``, of any schema; :class:`RecordError` in one line naming the file and,
    where one is missing or odd, the field."""
    try:
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            raise RecordError(f"{path!r}: {size:,} bytes, more than a record holds (at most {MAX_BYTES:,}); "
                              f"{accepted(kinds)}")
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise RecordError(f"{path!r} does not exist; {accepted(kinds)}") from None
    except (OSError, UnicodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{path!r} cannot be read as JSON ({exc}); {accepted(kinds)}") from None
    try:
        return from_data(data, kinds)
    except RecordError as exc:
        raise RecordError(f"{path!r}: {exc}; {accepted(kinds)}") from None


def from_data(data: Any, kinds: Kinds) -> Record:
    """A record of one of ``kinds`` from JSON data of any schema (``migrate`` first)."""
    data = migrate(data)
    kind = data.get("kind")
    if kind not in kinds:
        raise RecordError(f"a record of kind {kind!r}, which this version does not know")
    if data.get("schema", SCHEMA) > SCHEMA:
        raise RecordError(f"schema {data['schema']}, written by a newer freetoken-graphfix (this one reads "
                          f"up to {SCHEMA})")
    record = build(kinds[kind], {k: v for k, v in data.items() if k not in ("kind", "schema")}, kind)
    for name, arm in getattr(record, "arms", {}).items():
        for bs, instances in arm.replay_us.items():
            if len(instances) > MAX_INSTANCES or any(len(replays) > MAX_REPLAYS for replays in instances):
                raise RecordError(f"arms.{name}.replay_us.{bs}: more instances or replays than a run makes (at most "
                                  f"{MAX_INSTANCES:,} instances of {MAX_REPLAYS:,} replays)")
    return record


def build(cls: Any, data: Any, where: str) -> Any:
    """``data`` as an instance of type ``cls`` (a dataclass, a container of them, or plain data),
    checked field by field; :class:`RecordError` naming ``where`` a field is missing or odd."""
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if cls is Any:
        return data
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        real = [a for a in args if a is not type(None)]
        return build(real[0], data, where)
    if dataclasses.is_dataclass(cls):
        return _dataclass(cls, data, where)
    if origin in (list, tuple):
        if not isinstance(data, list):
            raise RecordError(f"{where}: expected a list, found {type(data).__name__}")
        item = args[0] if args else Any
        built = [build(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
        return tuple(built) if origin is tuple else built
    if origin is dict:
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected an object, found {type(data).__name__}")
        return {k: build(args[1], v, f"{where}[{k!r}]") for k, v in data.items()}
    return _scalar(cls, data, where)


def _dataclass(cls: Any, data: Any, where: str) -> Any:
    """A dataclass from a JSON object, field by field, naming the path of the first field missing or of the wrong
    type."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object, found {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            values[f.name] = build(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(f"{where}: missing {f.name!r}")
    return cls(**values)


def _scalar(cls: Any, data: Any, where: str) -> Any:
    """A JSON scalar checked against the field's type (null read as NaN for a float: a figure that could not be
    computed)."""
    if cls is float:
        if data is None:
            return math.nan  # written as null: a figure that could not be computed
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
    elif cls is int and isinstance(data, int) and not isinstance(data, bool):
        return data
    elif cls is bool and isinstance(data, bool):
        return data
    elif cls is str and isinstance(data, str):
        return data
    raise RecordError(f"{where}: expected {cls.__name__}, found {json.dumps(data)[:40]}")


# ---------------------------------------------------------------- records of the first schema

def migrate(data: Any) -> dict[str, Any]:
    """Data of any schema in the current one's shape: what each kind lacked filled in, renamed or
    dropped here and nowhere else, one schema at a time. Current data passes unchanged."""
    if not (isinstance(data, dict) and "schema" in data):
        data = {**_v1(data), "schema": 2}
    if data.get("schema") == 2:
        data = _v2(data)
    return data


def _v1(data: Any) -> dict[str, Any]:
    """A first-schema record (no kind, no schema) in the second schema's shape."""
    if isinstance(data, dict) and set(data) >= {"kind", "record"} and "code" in data:  # a GPU test's wrapper
        kind, data = data["kind"], data["record"]
        if kind in ("engine", "serve") and isinstance(data, dict):  # it held one case
            data = [data]
    return _object_v1(data) if isinstance(data, dict) else _cases_v1(data)


def _cases_v1(data: Any) -> dict[str, Any]:
    """A first-schema list of cases: the engine's (each with its traced runs) or serve's."""
    if isinstance(data, list) and data and all(isinstance(c, dict) and "runs" in c for c in data):
        if all("traced" in c for c in data):
            return {"kind": "engine", "cases": [_engine_case_v1(c) for c in data]}
        if all("problems" in c or "wait_case" in c for c in data):
            return {"kind": "serve", "cases": [_serve_case_v1(c) for c in data]}
    raise RecordError("not a bench record (its shape matches no kind)")


def _object_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A first-schema record that is one object: the rig's, start-up's or the matrix's, known by its
    keys; or one with a kind and no schema, taken as it is."""
    if "arms" in data and "config" in data:
        return {"kind": "rig", **_rig_v1(data)}
    if "delta_band_ms" in data:
        return {"kind": "startup", **data, "ms": {k: _summary_v1(v) for k, v in data["ms"].items()}}
    if "probes" in data:
        return {"kind": "deadlock", **_deadlock_v1(data)}
    if "kind" in data:
        return data
    raise RecordError("not a bench record (its shape matches no kind)")


def _rig_v1(data: dict[str, Any]) -> dict[str, Any]:
    """The first schema named the rig's modes strategies, and kept a host-time ratio no rule judged
    (dropped; its stager cost is kept)."""
    out = {k: v for k, v in data.items() if k != "host_overhead"}
    out["config"] = {("modes" if k == "strategies" else k): v for k, v in data["config"].items()}
    if "host_overhead" in data:
        out["stager_us"] = data["host_overhead"].get("armed_hook_us")
    return out


def _deadlock_v1(data: dict[str, Any]) -> dict[str, Any]:
    """The first schema kept no settings, and named a probe's mode its strategy."""
    probes = [{("mode" if k == "strategy" else k): v for k, v in p.items()} for p in data["probes"]]
    config = {"sizes": sorted({p["kernels"] for p in probes}), "modes": list(dict.fromkeys(p["mode"] for p in probes)),
              "jobs": 1, "watchdog": None}
    return {**data, "probes": probes, "config": data.get("config", config)}


def _summary_v1(s: dict[str, Any]) -> dict[str, Any]:
    """``{"n", "median", "p10", "p90"}`` (any two percentiles) as a :class:`Summary`."""
    pcts = sorted(int(k[1:]) for k in s if re.fullmatch(r"p\d+", k))
    low, high = (pcts + [10, 90])[:2] if len(pcts) < 2 else pcts[:2]
    return {"n": s["n"], "median": s.get("median"), "low": s.get(f"p{low}"), "high": s.get(f"p{high}"),
            "percentiles": [low, high]}


def _engine_case_v1(case: dict[str, Any]) -> dict[str, Any]:
    """A first-schema engine case in the current shape: its verdicts dropped (they are derived again), each process
    named by its arm."""
    out = {k: v for k, v in case.items() if k not in ("summary", "wait_case")}  # verdicts: derived again
    out["runs"] = {arm: [{"arm": arm, **{k: v for k, v in r.items() if k != "problems"}} for r in rs]
                   for arm, rs in case["runs"].items()}
    out["traced"] = {arm: [_traced_v1(t) for t in (ts if isinstance(ts, list) else [ts])]
                     for arm, ts in case.get("traced", {}).items()}
    out.setdefault("copies", 0)
    return out


def _traced_v1(t: dict[str, Any]) -> dict[str, Any]:
    """A traced process as ``timeline.decode_timeline`` wrote it: bs keys beside its note and tokens."""
    by_bs = {bs: {**f, "gap_us": {s: g["median"] if isinstance(g, dict) else g for s, g in f["gap_us"].items()}}
             for bs, f in t.items() if bs.isdigit()}
    return {"note": t.get("note", ""), "by_bs": by_bs, "token_ids": t.get("token_ids")}


PASS_LINE = re.compile(r"capture pass (\d+): \d+ graphs: (.*)")
PASS_PART = re.compile(r"(\d+) (\S+) \(([^()]*(?:\([^()]*\))?[^()]*)\)")


def _serve_case_v1(case: dict[str, Any]) -> dict[str, Any]:
    """A first-schema serve case in the current shape: its capture passes read from the log lines it kept."""
    out = {k: v for k, v in case.items() if k not in ("problems", "wait_case")}
    out["runs"] = {arm: {**r, "passes": [_pass_v1(pid, line) for pid, line in r.get("passes", [])]}
                   for arm, r in case["runs"].items()}
    return out


def _pass_v1(pid: int, line: str) -> dict[str, Any]:
    """A capture pass from the shim's INFO line, as the first schema kept it from the server's log:
    ``capture pass 0: 2 graphs: 2 deferred (PLE wait-sync)``."""
    m = PASS_LINE.fullmatch(line.strip())
    if m is None:
        raise RecordError(f"a capture pass line this version cannot read: {line[:60]!r}")
    actions, reasons = [], []
    for n, action, reason in PASS_PART.findall(m.group(2)):
        actions += [action] * int(n)
        reasons += [reason] * int(n)
    return {"pid": pid, "index": int(m.group(1)), "actions": actions, "reasons": reasons}


# ---------------------------------------------------------------- records of the second schema

def _v2(data: dict[str, Any]) -> dict[str, Any]:
    """The second schema named the never-uploaded arm by FreeToken's tracker (``pre-697``), kept an engine
    process's status without its pid, and a server's capture passes as actions and reasons."""
    out = {**data, "schema": 3}
    if data.get("kind") == "engine" and isinstance(data.get("cases"), list):
        out["cases"] = [_engine_case_v2(c) for c in data["cases"]]
    elif data.get("kind") == "serve" and isinstance(data.get("cases"), list):
        out["cases"] = [{**c, "runs": {arm: _serve_run_v2(r) for arm, r in c["runs"].items()}}
                        if isinstance(c, dict) and isinstance(c.get("runs"), dict) else c for c in data["cases"]]
    return out


def _engine_case_v2(case: Any) -> Any:
    """Arms renamed, in the keys and in each process; each status given the pid it was not kept with (0)."""
    if not isinstance(case, dict):
        return case
    out = dict(case)
    for key in ("runs", "traced"):
        if isinstance(case.get(key), dict):
            out[key] = {RENAMED.get(arm, arm): runs for arm, runs in case[key].items()}
    if isinstance(out.get("runs"), dict):
        out["runs"] = {arm: [_engine_process_v2(r) for r in runs] if isinstance(runs, list) else runs
                       for arm, runs in out["runs"].items()}
    return out


def _engine_process_v2(run: Any) -> Any:
    """One engine process: its arm renamed, its status given pid 0 (the second schema did not keep it)."""
    if not isinstance(run, dict):
        return run
    out = {**run, "arm": RENAMED.get(run.get("arm"), run.get("arm"))}
    if isinstance(run.get("shim"), dict):
        out["shim"] = {"pid": 0, **run["shim"]}
    return out


def _serve_run_v2(run: Any) -> Any:
    """A server's capture passes (pid, index, actions, reasons) as one status per process: what they kept,
    and nothing they did not (each graph named by its place, no WAITs, no hook time; the status itself
    read as patched, since only a patched shim records a pass)."""
    if not isinstance(run, dict) or not isinstance(run.get("passes"), list):
        return run
    shims: dict[Any, dict[str, Any]] = {}
    for p in run["passes"]:
        status = shims.setdefault(p["pid"], {
            "installed": True, "mode": run.get("arm"), "patched": True,
            "reason": "read from a record of the second schema: capture passes only", "passes": [], "pid": p["pid"]})
        graphs = [{"index": i, "name": f"graph #{i}", "waits": [], "action": action, "reason": reason,
                   "hook_ms": None} for i, (action, reason) in enumerate(zip(p["actions"], p["reasons"], strict=True))]
        status["passes"].append({"index": p["index"], "source": "GraphRunner._capture_graphs", "graphs": graphs,
                                 "done": True})
    out = {k: v for k, v in run.items() if k != "passes"}
    out["shims"] = list(shims.values())
    return out


# What reading figures out of a record that is JSON, of a known kind, but damaged can raise: a field emptied,
# retyped, set to NaN or zero. Every one is a single line naming the file, never a traceback.
DAMAGED = (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, StopIteration, AttributeError,
           OverflowError)


def damaged(path: str, exc: Exception, kinds: Kinds) -> str:
    """The one line for a damaged record."""
    return (f"{path!r}: a damaged record ({type(exc).__name__}: {str(exc)[:120] or 'no detail'}); "
            f"{accepted(kinds)}")
