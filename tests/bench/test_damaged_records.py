"""Damaged records and traces, a few hundred ways each: ``bench report`` and ``bench nsys`` either judge
them or refuse them in one line naming the file; never a traceback. Every record in tests/records/ and
every trace in tests/traces/ is mutated, seeded: a field deleted, emptied, retyped, set to NaN, 0 or a
negative number, a list shortened, the file truncated."""

from __future__ import annotations

import copy
import gzip
import json
import math
import random
from pathlib import Path

import pytest

from freetoken_graphfix_bench import cli

HERE = Path(__file__).resolve().parents[1]  # tests/, where the records and traces are
RECORDS = sorted((HERE / "records").rglob("*.json"))
TRACES = sorted((HERE / "traces").glob("*.csv.gz"))
assert RECORDS and TRACES, "no records or traces found: a moved folder would leave these tests empty"
MUTATIONS = 120  # per record: about 1,400 damaged records in all


def paths_in(data, prefix=()):
    """Every place in the JSON tree: the key or index path to it."""
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from paths_in(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data[:3]):  # the first items stand for the rest
            yield from paths_in(value, (*prefix, i))


def mutated(data, where: tuple, how: str):
    """``data`` with the value at ``where`` damaged ``how``."""
    data = copy.deepcopy(data)
    if not where:
        return {} if how == "empty" else []
    parent = data
    for step in where[:-1]:
        parent = parent[step]
    key, value = where[-1], parent[where[-1]]
    if how == "delete":
        del parent[key]
    elif how == "empty":
        parent[key] = type(value)() if isinstance(value, (dict, list, str)) else None
    elif how == "retype":
        parent[key] = ({"x": 1} if isinstance(value, list) else [1] if isinstance(value, dict) else
                       "x" if isinstance(value, (int, float)) else 7)
    elif how == "shorten" and isinstance(value, list):
        parent[key] = value[:len(value) // 2]
    else:
        parent[key] = {"nan": math.nan, "zero": 0, "negative": -1}.get(how, value)
    return data


def judged_or_refused(argv: list[str], path: Path, capsys) -> None:
    """The command's outcome on a damaged file: a report (exit 0 or 1), or one line on stderr naming it."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code in (0, 1), (code, err)
    if err:
        assert err.count("\n") == 1 and str(path) in err, err
    else:
        assert out.strip(), "exited without a word"


@pytest.mark.parametrize("record", RECORDS, ids=[p.name for p in RECORDS])
def test_a_damaged_record_is_judged_or_refused_in_one_line(record, tmp_path, capsys):
    data = json.loads(record.read_text())
    places = list(paths_in(data))
    rng = random.Random(f"{record.name}-775")
    target = tmp_path / record.name
    hows = ("delete", "empty", "retype", "nan", "zero", "negative", "shorten")
    for _ in range(MUTATIONS):
        where, how = rng.choice(places), rng.choice(hows)
        if how == "delete" and not where:
            continue
        target.write_text(json.dumps(mutated(data, where, how)))
        judged_or_refused(["report", str(target)], target, capsys)
    text = record.read_text()
    for cut in sorted(rng.sample(range(1, len(text)), min(20, len(text) - 1))):  # the file truncated
        target.write_text(text[:cut])
        judged_or_refused(["report", str(target)], target, capsys)


@pytest.mark.parametrize("trace", TRACES, ids=[p.name for p in TRACES])
def test_a_damaged_trace_is_read_or_refused_in_one_line(trace, tmp_path, capsys):
    lines = gzip.decompress(trace.read_bytes()).decode().splitlines()
    rng = random.Random(f"{trace.name}-775")
    target = tmp_path / "t_cuda_gpu_trace.csv"
    for _ in range(MUTATIONS):
        damaged = list(lines)
        row = rng.randrange(len(damaged))
        cells = damaged[row].split(",")
        how = rng.choice(("delete", "empty", "nan", "zero", "negative", "retype", "truncate"))
        if how == "truncate":
            damaged = damaged[:row]
        elif how == "delete":
            del cells[rng.randrange(len(cells))]
        else:
            cells[rng.randrange(len(cells))] = {"empty": "", "nan": "nan", "zero": "0", "negative": "-1",
                                                "retype": '"x"'}[how]
        if how not in ("truncate",):
            damaged[row] = ",".join(cells)
        target.write_text("\n".join(damaged) + "\n")
        judged_or_refused(["nsys", str(target)], target, capsys)


def test_the_mutations_reach_what_used_to_raise(tmp_path, capsys):
    """The cases a new user found, each once: an empty arms table, an empty first-launch table, replays all NaN,
    all zero, a schema given as a word, an engine record with no case."""
    rig = json.loads((HERE / "records" / "rig-bench.json").read_text())
    arm = next(iter(rig["arms"]))
    bs = next(iter(rig["arms"][arm]["replay_us"]))
    cases = {
        "arms": mutated(rig, ("arms",), "empty"),
        "first_launch": mutated(rig, ("arms", arm, "first_launch"), "empty"),
        "nan": {**rig, "arms": {a: {**v, "replay_us": {b: [[math.nan] * 4 for _ in r] for b, r in
                                                      v["replay_us"].items()}} for a, v in rig["arms"].items()}},
        "zero": {**rig, "arms": {a: {**v, "replay_us": {b: [[0.0] * 4 for _ in r] for b, r in v["replay_us"].items()}}
                                 for a, v in rig["arms"].items()}},
        "schema": {**rig, "schema": "two"},
        "no case": {"kind": "engine", "schema": 2, "cases": []},
    }
    assert bs
    for name, data in cases.items():
        target = tmp_path / f"{name.replace(' ', '-')}.json"
        target.write_text(json.dumps(data))
        code = cli.main(["report", str(target)])
        out, err = capsys.readouterr()
        assert code == 1 and (err.count("\n") == 1 and str(target) in err or not err and out.strip()), (name, err)


def test_a_record_listing_more_instances_than_a_run_makes_is_refused(tmp_path, capsys):
    """A small file can list a great many instances; past the cap it is refused in one line, before any maths."""
    rig = json.loads((HERE / "records" / "rig-bench.json").read_text())
    arm = next(iter(rig["arms"]))
    bs = next(iter(rig["arms"][arm]["replay_us"]))
    rig["arms"][arm]["replay_us"][bs] = [[1.0]] * 10_001
    target = tmp_path / "many.json"
    target.write_text(json.dumps(rig))
    assert cli.main(["report", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(target) in err and "at most 10,000 instances" in err, err
