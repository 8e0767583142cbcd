"""``python -m freetoken_graphfix`` / ``freetoken-graphfix``: doctor, run, patch, bench."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
from collections.abc import Callable, Iterator

from . import __version__, bootstrap, config
from .errors import ConfigError, GraphfixError, shown

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

    Exits 1 when it finds a problem a user must fix (a bad ``FT_GRAPH_UPLOAD``, a FreeToken that
    cannot be imported, a short check whose protected first launch blocked)."""
    line = lambda k, v: print(f"{k:>24}: {v}")  # noqa: E731
    problems = 0
    line("freetoken-graphfix", f"{__version__} at {os.path.dirname(os.path.abspath(__file__))}")
    line("python", f"{sys.executable} ({sys.version.split()[0]})")
    try:
        from . import hooks
    except ImportError as exc:  # a dependency missing (an offline install with --no-deps)
        line("shim", f"PROBLEM: cannot be loaded: {exc} (pip install freetoken-graphfix's dependencies: wrapt, "
                     "packaging)")
        return ERR
    user_value = hooks.user_env_value()
    bad_mode = ""  # said once, on its own line: the lines after it refer to it
    try:
        mode = config.parse_mode(user_value)
        line(config.ENV_MODE, f"unset (mode {mode.value})" if user_value is None else
             f"{shown(user_value)} (mode {mode.value})")
    except ConfigError as exc:
        problems += 1
        bad_mode = str(exc)
        line(config.ENV_MODE, f"PROBLEM: {exc}")

    def said(text: str) -> str:
        return text.replace(bad_mode, f"{config.ENV_MODE} is not a valid mode (above)") if bad_mode else text

    with _quiet_freetoken():  # FreeToken's own INFO lines and progress bars are not this report
        try:
            import freetoken.engine.graph  # noqa: F401  (fires the shim's post-import hook)
        except Exception as exc:
            failure: Exception | None = exc
        else:
            failure = None
        state = hooks.status()
    ft = state["freetoken"]
    if failure is not None:
        problems += 1
        line("freetoken", f"PROBLEM: cannot be imported: {type(failure).__name__}: {failure}")
    else:
        tested = ("a tested release" if ft["tested"] else "not inspected: the shim did not install"
                  if ft["tested"] is None else "an untested release: decided by feature")
        where = ft["path"] or os.path.dirname(sys.modules["freetoken"].__file__)
        line("freetoken", f"{ft['version']} at {where} ({tested})")
    line("shim in doctor", f"{'patched' if state['patched'] else 'not patched'}"
         + (f", mode {state['mode']}" if state["mode"] else "") + f": {said(state['reason'])} (doctor imports the "
         "shim itself, so this holds for this process only)")
    if state["deferred"]["reason"]:
        line("deferred guard", f"{'available' if state['deferred']['available'] else 'unavailable'}: "
             f"{state['deferred']['reason']}")
    from . import patching

    line("patch series", patching.describe_installed())
    pth = bootstrap.installed_pth()
    line("bootstrap .pth", str(pth) if pth else "not installed (pip install freetoken-graphfix into this environment)")
    active, why = bootstrap.would_activate(user_value)
    line("shim in new processes", f"{'installed' if active else 'NOT installed'}: {said(why)}")
    line("interpreters", ", ".join(bootstrap.interpreters()))
    line("turn it off", f"{config.ENV_MODE}=off (or 0, false), or pip uninstall freetoken-graphfix")
    print("modes:")
    for name, text in MODE_HELP.items():
        print(f"{name:>24}: {text}")
    if not args.no_bench and failure is None:
        problems += _short_check(line)
    return ERR if problems else OK


@contextlib.contextmanager
def _quiet_freetoken() -> Iterator[None]:
    """FreeToken logs through its own stdout handler, and the shim's lines would say again what the
    report says: hold both back while the report imports FreeToken (the report's own lines are
    printed after it)."""
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
            mode = config.parse_mode(bootstrap.user_env_value())
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or pass --mode)") from None
    try:
        executable = run.resolve(command[0])
        env = dict(os.environ, **{config.ENV_MODE: mode.value})
        for warning in (run.foreign_python(executable, env),
                        None if bootstrap.installed_pth() else
                        f"freetoken_graphfix: warning: {bootstrap.PTH_NAME} is not installed in this environment; "
                        "only processes that import freetoken_graphfix will get the shim"):
            if warning:
                print(warning, file=sys.stderr)
        return run.supervise([executable, *command[1:]], env, exiting=True)
    except run.CommandError as exc:
        print(f"freetoken_graphfix: error: {exc}", file=sys.stderr)
        return exc.code


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
        print(f"note: {patching.site_note(target)}")
    return OK


def do_bench(args: argparse.Namespace) -> int:
    """Implementation of 'bench': hand the remaining arguments to the benchmark."""
    from .bench import cli as bench_cli

    return bench_cli.main(args.bench_args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "doctor": do_doctor, "run": do_run, "bench": do_bench, "patch": do_patch,
}


DESCRIPTION = "Protect only the FreeToken CUDA graphs that need it, at no replay cost."


def program() -> str:
    """The program as the user invoked it: the console script, ``scripts/freetoken-patch``, or
    ``python -m``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name in ("freetoken-graphfix", "freetoken-patch") else "python -m freetoken_graphfix"


def parser(prog: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser, and each command's own (for its own usage on its own errors)."""
    prog = prog or program()
    ap = argparse.ArgumentParser(prog=prog, description=DESCRIPTION,
                                 epilog="'<command> -h' describes a command and its options.")
    ap.add_argument("--version", action="version", version=f"freetoken-graphfix {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, title="commands", metavar="{doctor,run,patch,bench}")
    doctor = sub.add_parser("doctor", help="what is installed and what the shim would do (run this first)",
                            description="What is installed, what the shim does with it in this process and in "
                                        "new ones, which patch series is applied, and, with a CUDA device, a short "
                                        "first-launch check. Exits 1 when it finds a problem to fix.")
    doctor.add_argument("--no-bench", action="store_true", help="skip the short GPU check (three first-launch probes)")
    modes = ", ".join(config.ACCEPTED)
    run = sub.add_parser("run", help="run a command with the shim enabled: run -- ft serve ...",
                         description="Run COMMAND with FT_GRAPH_UPLOAD set, so that every Python process it starts "
                                     "(ft serve's scheduler included) loads the shim. Signals go on to the command; "
                                     "the exit code is the command's (128+N if a signal N killed it; 127 not found, "
                                     "126 not executable).",
                         epilog="example: run -- ft serve --model ~/models/qwen")
    run.add_argument("--mode", metavar="MODE", help=f"the mode for the command, of: {modes} "
                                                    f"(default: {config.ENV_MODE}, else auto)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]",
                     help="the command and its arguments, after --")
    patch = sub.add_parser("patch", help="check, apply or revert the patch series for FreeToken (patches/)",
                           **({"prog": prog} if prog == "freetoken-patch" else {}),  # scripts/freetoken-patch
                           description="The patch series for FreeToken itself, on a checkout (--repo) or on the "
                                       "installed FreeToken (--site). Every run is all or nothing, and runs on one "
                                       "tree take turns.")
    patch.add_argument("action", choices=["check", "apply", "revert"], metavar="ACTION",
                       help="check (say whether the series is applied), apply, or revert (to the release's bytes)")
    where = patch.add_mutually_exclusive_group(required=True)
    where.add_argument("--repo", metavar="PATH", help="a FreeToken checkout (the folder holding python/freetoken/)")
    where.add_argument("--site", action="store_true", help="the FreeToken installed in this environment")
    sub.add_parser("bench", help="measure what the upload and each mode cost on this GPU (bench -h: its options)",
                   add_help=False)
    return ap, {"doctor": doctor, "run": run, "patch": patch}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = program()
    try:
        if argv[:1] == ["bench"]:  # bench owns its options (argparse REMAINDER would not pass "--x" on)
            from .bench import cli as bench_cli

            return bench_cli.main(argv[1:], prog=f"{prog} bench")
        ap, commands = parser(prog)
        if argv[:1] == ["--mode"] or argv[:1] and argv[0].startswith("--mode="):
            ap.error("--mode is run's option: put it after run (run --mode MODE -- COMMAND)")
        args, extra = ap.parse_known_args(argv)
        if extra:  # (run's command takes every argument after its name: these came before it)
            commands[args.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s %(message)s")
        try:
            return COMMANDS[args.cmd](args)
        except GraphfixError as exc:
            print(f"freetoken_graphfix: error: {exc}", file=sys.stderr)
            return ERR
    except KeyboardInterrupt:  # Ctrl-C outside run's own handling: no traceback, a shell's code
        return 128 + 2
    except BrokenPipeError:  # `doctor | head`: the reader left; say nothing more, as a shell tool would
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
