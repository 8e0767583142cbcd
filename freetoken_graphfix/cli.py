"""``python -m freetoken_graphfix`` / ``freetoken-graphfix``: doctor, run, bench."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable

from . import __version__, bootstrap, config, hooks
from .errors import GraphfixError

OK, ERR = 0, 1

MODE_HELP = {
    "auto": "no-op for graphs without a host-released WAIT; deferred (else warm) for the others",
    "upload": "FreeToken's own behaviour: cuGraphUpload + synchronize on every graph",
    "skip": "no upload anywhere; WARNING for graphs whose first launch can deadlock",
    "warm": "one threaded warm replay at capture for graphs that need protection; no-op otherwise",
    "deferred": "no upload; the first launch's PLE fill runs on a thread started before it",
    "off": "the shim patches nothing (also 0, false)",
}


def do_doctor(args: argparse.Namespace) -> int:
    """Implementation of 'doctor': what is installed, what the shim does with it, and a short bench."""
    line = lambda k, v: print(f"{k:>22}: {v}")  # noqa: E731
    line("freetoken-graphfix", __version__)
    line("python", f"{sys.executable} ({sys.version.split()[0]})")
    user_value = hooks.user_env_value()
    line(config.ENV_MODE, "unset (mode auto)" if user_value is None else repr(user_value))
    try:
        import freetoken.engine.graph  # noqa: F401  (fires the shim's post-import hook)
    except Exception as exc:
        line("freetoken", f"not importable: {exc!r}")
    state = hooks.status()
    ft = state["freetoken"]
    line("freetoken", f"{ft['version']} at {ft['path']} (tested: {ft['tested']})")
    line("shim mode", state["mode"])
    line("patched", f"{'yes' if state['patched'] else 'no'}: {state['reason']}")
    line("deferred", f"{'available' if state['deferred']['available'] else 'unavailable'}: "
         f"{state['deferred']['reason']}")
    for mode, text in MODE_HELP.items():
        line(f"mode {mode}", text)
    pth = bootstrap.installed_pth()
    line("bootstrap .pth", str(pth) if pth else "not installed")
    active, why = bootstrap.would_activate(user_value)
    line("new processes", f"{'shim installed' if active else 'shim NOT installed'}: {why}")
    line("interpreters", ", ".join(bootstrap.interpreters()))
    line("turn it off", f"{config.ENV_MODE}=off (or 0, false), or pip uninstall freetoken-graphfix")
    from . import patching

    line("patch series", patching.describe_installed())
    return _doctor_bench(line) if not args.no_bench else OK


def _doctor_bench(line: Callable[[str, str], None]) -> int:
    try:
        import torch
    except ImportError:
        line("bench", "skipped: torch not importable")
        return OK
    if not torch.cuda.is_available():
        line("bench", "skipped: no CUDA device")
        return OK
    from .bench import cli as bench_cli

    return bench_cli.main(["--short"])


def do_run(args: argparse.Namespace) -> int:
    """Implementation of 'run': the command, with the shim enabled in every Python process it starts."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise GraphfixError("run: no command given; usage: python -m freetoken_graphfix run -- ft serve ...")
    value = args.mode if args.mode is not None else (hooks.user_env_value() or config.Mode.AUTO.value)
    mode = config.parse_mode(value, source="--mode" if args.mode is not None else config.ENV_MODE)
    if bootstrap.installed_pth() is None:
        print(f"freetoken_graphfix: warning: {bootstrap.PTH_NAME} is not installed in this environment; "
              "only processes that import freetoken_graphfix will get the shim", file=sys.stderr)
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise GraphfixError(f"run: command not found: {command[0]!r}")
    env = dict(os.environ, **{config.ENV_MODE: mode.value})
    code = subprocess.call(command, env=env)
    return 128 - code if code < 0 else code  # a child killed by signal N exits 128+N, as in a shell


def do_patch(args: argparse.Namespace) -> int:
    """Implementation of 'patch': check, apply or revert the series on a checkout or an install."""
    from . import patching

    target = patching.repo_target(args.repo) if args.repo else patching.site_target()
    if args.action == "check":
        print(f"{target.label}: {patching.state(target)}")
    else:
        print((patching.apply if args.action == "apply" else patching.revert)(target))
        if not args.repo:
            print(f"note: {patching.SITE_NOTE}")
    return OK


def do_bench(args: argparse.Namespace) -> int:
    """Implementation of 'bench': hand the remaining arguments to the benchmark."""
    from .bench import cli as bench_cli

    return bench_cli.main(args.bench_args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "doctor": do_doctor, "run": do_run, "bench": do_bench, "patch": do_patch,
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m freetoken_graphfix", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    doctor = sub.add_parser("doctor", help="what is installed and what the shim would do (run this first)")
    doctor.add_argument("--no-bench", action="store_true", help="skip the short GPU benchmark")
    run = sub.add_parser("run", help="run a command with the shim enabled: run -- ft serve ...")
    run.add_argument("--mode", help=f"mode for the command (default: {config.ENV_MODE} or auto)")
    run.add_argument("command", nargs=argparse.REMAINDER)
    patch = sub.add_parser("patch", help="check, apply or revert the upstream patch series (patches/)")
    patch.add_argument("action", choices=["check", "apply", "revert"])
    where = patch.add_mutually_exclusive_group(required=True)
    where.add_argument("--repo", metavar="PATH", help="a FreeToken git checkout (python/freetoken/...)")
    where.add_argument("--site", action="store_true", help="the FreeToken installed in this environment")
    bench = sub.add_parser("bench", help="measure what the upload and each strategy cost on this GPU",
                           add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # bench owns its options (argparse REMAINDER would not pass "--x" on)
        from .bench import cli as bench_cli

        return bench_cli.main(argv[1:])
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s %(message)s")
    try:
        return COMMANDS[args.cmd](args)
    except GraphfixError as exc:
        print(f"freetoken_graphfix: error: {exc}", file=sys.stderr)
        return ERR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
