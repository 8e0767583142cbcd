"""``python -m freetoken_graphfix`` / ``freetoken-graphfix``: doctor, run, patch, bench."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from .. import __version__, bootstrap, config
from ..errors import ConfigError
from . import exits
from .exits import OK, PATCH_NOT_APPLIED, PATCH_PARTLY, Parser, UsageError

PATCH_CHECK_CODES = ("exit codes: 0 applied, 3 not applied, 4 partly applied (the first patches only), "
                     "1 the tree fits no prefix of the series (or another error), 2 a usage error")


def do_doctor(args: argparse.Namespace) -> int:
    """Implementation of 'doctor'."""
    from . import doctor

    return doctor.run(short_check=not args.no_bench)


def do_run(args: argparse.Namespace) -> int:
    """Implementation of 'run': the command, with the shim enabled in every Python process it starts."""
    from . import launcher

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("run: no command given (freetoken-graphfix run -- ft serve ...)")
    if args.mode is not None:
        mode = config.parse_mode(args.mode, source="--mode")
    else:
        try:
            mode = config.parse_mode(bootstrap.user_env_value())
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or pass --mode)") from None
    executable = launcher.resolve(command[0])  # a CommandError carries the shell's code (127, 126)
    env = dict(os.environ, **{config.ENV_MODE: mode.value})
    for warning in (launcher.foreign_python(executable, env),
                    f"{exits.WARNING}mode skip {config.SKIP_RISK}" if mode is config.Mode.SKIP else None,
                    None if bootstrap.installed_pth() else
                    f"{exits.WARNING}{bootstrap.PTH_NAME} is not installed in this environment; only processes "
                    "that install the shim themselves will get it"):
        if warning:
            print(warning, file=sys.stderr)
    return launcher.supervise([executable, *command[1:]], env, exiting=True)


def do_patch(args: argparse.Namespace) -> int:
    """Implementation of 'patch': check, apply or revert the series on a checkout or an install."""
    from . import series

    target = series.repo_target(args.repo) if args.repo is not None else series.site_target()
    if args.action == "check":
        applied, said = series.state(target)
        print(f"{target.label}: {said}")
        return OK if applied == len(series.series()) else PATCH_NOT_APPLIED if applied == 0 else PATCH_PARTLY
    changed, message = (series.apply if args.action == "apply" else series.revert)(target)
    print(message)
    if changed and args.action == "apply" and args.repo is None:
        print(f"note: {series.site_note(target)}")
    return OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"doctor": do_doctor, "run": do_run, "patch": do_patch}
PLUGIN_GROUP = "freetoken_graphfix.commands"  # 'bench' (the benchmarks' own package) registers itself here
PLUGIN_HELP = {"bench": "measure what the upload and each mode cost on this GPU (bench -h: its benchmarks)"}


def commands_installed() -> dict[str, Any]:
    """The commands other packages of the distribution register (``bench``): their entry points, by name. The
    shim's package never imports the benchmarks; the command line finds them as pip finds its plugins."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


DESCRIPTION = "Protect only the FreeToken CUDA graphs that need it, at no replay cost."


def program() -> str:
    """The program as the user invoked it: the console script, ``scripts/freetoken-patch``, or
    ``python -m``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name in ("freetoken-graphfix", "freetoken-patch") else "python -m freetoken_graphfix"


def parser(prog: str | None = None, plugins: list[str] | None = None
           ) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser, and each command's own (for its own usage on its own errors); ``plugins``: the registered
    commands' names, where the caller has read them already."""
    prog = prog or program()
    ap = Parser(prog=prog, description=DESCRIPTION, epilog="'<command> -h' describes a command and its options.")
    ap.add_argument("--version", action="version", version=f"freetoken-graphfix {__version__}")
    plugins = list(commands_installed()) if plugins is None else plugins
    sub = ap.add_subparsers(dest="cmd", required=True, title="commands",
                            metavar="{" + ",".join(["doctor", "run", "patch", *plugins]) + "}")
    doctor = sub.add_parser("doctor", command="doctor",
                            help="what is installed and what the shim would do (run this first)",
                            description="What is installed, what the shim does with it in this process and in "
                                        "new ones, which patch series is applied, and, with a CUDA device, a short "
                                        "first-launch check. Exits 1 when it finds a problem to fix.")
    doctor.add_argument("--no-bench", action="store_true", help="skip the short GPU check (three first-launch probes)")
    modes = ", ".join(config.ACCEPTED)
    run = sub.add_parser("run", command="run", help="run a command with the shim enabled: run -- ft serve ...",
                         description="Run COMMAND with FT_GRAPH_UPLOAD set, so that every Python process it starts "
                                     "(ft serve's scheduler included) loads the shim. Signals go on to the command; "
                                     "the exit code is the command's (128+N if a signal N killed it; 127 not found, "
                                     "126 not executable).",
                         epilog="example: run -- ft serve --model ~/models/qwen")
    run.add_argument("--mode", metavar="MODE", help=f"the mode for the command, of: {modes} "
                                                    f"(default: {config.ENV_MODE}, else auto)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]",
                     help="the command and its arguments, after --")
    patch = sub.add_parser("patch", command="patch",
                           help="check, apply or revert the patch series for FreeToken (patches/)",
                           **({"prog": prog} if prog == "freetoken-patch" else {}),  # scripts/freetoken-patch
                           description="The patch series for FreeToken itself, on a checkout (--repo) or on the "
                                       "installed FreeToken (--site). Every run is all or nothing, and runs on one "
                                       "tree take turns.", epilog=f"check's {PATCH_CHECK_CODES}.")
    patch.add_argument("action", choices=["check", "apply", "revert"], metavar="ACTION",
                       help="check (say whether the series is applied), apply, or revert (to the release's bytes)")
    where = patch.add_mutually_exclusive_group(required=True)
    where.add_argument("--repo", metavar="PATH", help="a FreeToken checkout (the folder holding python/freetoken/)")
    where.add_argument("--site", action="store_true", help="the FreeToken installed in this environment")
    for name in plugins:  # listed here, parsed by their own command line
        sub.add_parser(name, add_help=False, help=PLUGIN_HELP.get(name, f"{name} -h: its own help"))
    return ap, {"doctor": doctor, "run": run, "patch": patch}


def main(argv: list[str] | None = None) -> int:
    """Entry point: a command another package registers (``bench``) handed its arguments whole; every error one line
    and a shell's exit code (``exits.run``)."""
    argv = sys.argv[1:] if argv is None else argv
    return exits.run(lambda: _main(argv, program()))


def _main(argv: list[str], prog: str) -> int:
    """Parse ``argv`` and run its command."""
    plugins = commands_installed()
    if argv[:1] and argv[0] in plugins:  # a command of its own (git's external commands)
        return plugins[argv[0]].load()(argv[1:], prog=f"{prog} {argv[0]}")
    ap, commands = parser(prog, list(plugins))
    if argv[:1] == ["--mode"] or argv[:1] and argv[0].startswith("--mode="):
        ap.error("--mode is run's option: put it after run (run --mode MODE -- COMMAND)")
    args, extra = ap.parse_known_args(argv)
    if extra:  # (run's command takes every argument after its name: these came before it)
        commands[args.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s %(message)s")
    return COMMANDS[args.cmd](args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
