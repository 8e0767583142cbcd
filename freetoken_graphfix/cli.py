"""``python -m freetoken_graphfix`` / ``freetoken-graphfix``: doctor, run, bench."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
from collections.abc import Callable, Iterator

from . import __version__, bootstrap, config, hooks
from .errors import ConfigError, GraphfixError

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
    """Implementation of 'doctor': what is installed, what the shim does with it, and a short check.

    Exits 1 when it finds a problem a user must fix (a bad ``FT_GRAPH_UPLOAD``, a short check
    whose protected first launch blocked)."""
    line = lambda k, v: print(f"{k:>20}: {v}")  # noqa: E731
    problems = 0
    line("freetoken-graphfix", __version__)
    line("python", f"{sys.executable} ({sys.version.split()[0]})")
    user_value = hooks.user_env_value()
    try:
        mode = config.parse_mode(user_value)
        line(config.ENV_MODE, f"unset (mode {mode.value})" if user_value is None else
             f"{user_value!r} (mode {mode.value})")
    except ConfigError as exc:
        problems += 1
        line(config.ENV_MODE, f"PROBLEM: {exc}")
    with _quiet_freetoken():  # FreeToken's own INFO lines and progress bars are not this report
        try:
            import freetoken.engine.graph  # noqa: F401  (fires the shim's post-import hook)
        except Exception as exc:
            line("freetoken", f"not importable: {exc!r}")
            importable = False
        else:
            importable = True
        state = hooks.status()
    ft = state["freetoken"]
    if importable:
        tested = "a tested release" if ft["tested"] else "an untested release: decided by feature"
        line("freetoken", f"{ft['version']} at {ft['path']} ({tested})")
    line("shim", f"{'patched' if state['patched'] else 'not patched'}"
         + (f", mode {state['mode']}" if state["mode"] else "") + f": {state['reason']}")
    if state["deferred"]["reason"]:
        line("deferred guard", f"{'available' if state['deferred']['available'] else 'unavailable'}: "
             f"{state['deferred']['reason']}")
    from . import patching

    line("patch series", patching.describe_installed())
    pth = bootstrap.installed_pth()
    line("bootstrap .pth", str(pth) if pth else "not installed (pip install freetoken-graphfix into this environment)")
    active, why = bootstrap.would_activate(user_value)
    line("new processes", f"{'shim installed' if active else 'shim NOT installed'}: {why}")
    line("interpreters", ", ".join(bootstrap.interpreters()))
    line("turn it off", f"{config.ENV_MODE}=off (or 0, false), or pip uninstall freetoken-graphfix")
    print("modes:")
    for name, text in MODE_HELP.items():
        print(f"{name:>20}: {text}")
    if not args.no_bench and importable:
        problems += _short_check(line)
    return ERR if problems else OK


@contextlib.contextmanager
def _quiet_freetoken() -> Iterator[None]:
    """FreeToken logs through its own stdout handler, and the shim's lines would say again what the
    report says: hold both back while the report imports FreeToken."""
    before = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(before)


def _short_check(line: Callable[[str, str], None]) -> int:
    """What one short run can support: a protected first launch against the unprotected control,
    and the hook's cost at capture. The replay verdict needs ``bench`` (several instances)."""
    try:
        import torch
    except ImportError:
        line("short check", "skipped: torch is not importable")
        return 0
    if not torch.cuda.is_available():
        line("short check", "skipped: no CUDA device")
        return 0
    from .bench import deadlock

    check = deadlock.short_check()
    for key, value in check.lines:
        line(key, value)
    line("replay verdict", "python -m freetoken_graphfix bench (about 2 minutes; does the upload cost this GPU?)")
    line("short check log", check.log)
    return check.problems


def do_run(args: argparse.Namespace) -> int:
    """Implementation of 'run': the command, with the shim enabled in every Python process it starts."""
    from . import run

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise GraphfixError("run: no command given; usage: python -m freetoken_graphfix run -- ft serve ...")
    if args.mode is not None:
        mode = config.parse_mode(args.mode, source="--mode")
    else:
        try:
            mode = config.parse_mode(hooks.user_env_value())
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or pass --mode)") from None
    try:
        executable = run.resolve(command[0])
    except run.CommandError as exc:
        print(f"freetoken_graphfix: error: {exc}", file=sys.stderr)
        return exc.code
    for warning in (run.foreign_python(executable),
                    None if bootstrap.installed_pth() else
                    f"freetoken_graphfix: warning: {bootstrap.PTH_NAME} is not installed in this environment; "
                    "only processes that import freetoken_graphfix will get the shim"):
        if warning:
            print(warning, file=sys.stderr)
    env = dict(os.environ, **{config.ENV_MODE: mode.value})
    return run.supervise([executable, *command[1:]], env)


def do_patch(args: argparse.Namespace) -> int:
    """Implementation of 'patch': check, apply or revert the series on a checkout or an install."""
    from . import patching

    target = patching.repo_target(args.repo) if args.repo is not None else patching.site_target()
    if args.action == "check":
        print(f"{target.label}: {patching.state(target)}")
        return OK
    changed, message = (patching.apply if args.action == "apply" else patching.revert)(target)
    print(message)
    if changed and args.action == "apply" and args.repo is None:
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
    doctor.add_argument("--no-bench", action="store_true", help="skip the short GPU check (three first-launch probes)")
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
