"""The model a real-engine bench runs: the synthetic qwen4_exp this package writes, or ``--model``.

``--model`` is any model directory FreeToken loads (a checkpoint, or ``config.json`` and a tokenizer
with ``-- --dummy-weight``). FreeToken's own ``ft serve`` options follow ``--`` (for the synthetic
model too, after its own): they are validated by FreeToken's own parser
(``freetoken.server.args.parse_args``) before any engine starts, and every option not given keeps the
default FreeToken chooses for that model. Whether the model's decode graphs
will hold a WAIT that the host releases after the launch (the one the upload exists for) is read from
its config: qwen4_exp with real weights and the disk PLE backend; the runs then say what they found.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BENCH_OWNS = ("--model", "--model-path", "--host", "--port")  # bench sets these itself
# what makes the synthetic model the WAIT case (the disk PLE table, its real weights): not the user's to change
SYNTHETIC_FIXED = ("--ple-backend", "--dummy-weight")
WAIT_FAMILY = "qwen4_exp"  # the one family with a host-released WAIT (disk PLE, CUDA wait-sync)


class TargetError(ValueError):
    """A ``--model`` or FreeToken option the bench cannot run; its message is one line."""


@dataclass(frozen=True)
class Target:
    """What a bench runs: ``model_dir`` (``None``: the synthetic qwen4_exp, written per ``--layers``)
    with FreeToken's options ``ft_args``, and what its config says."""

    model_dir: str | None
    ft_args: tuple[str, ...]
    family: str
    architecture: str
    dummy: bool
    expects_wait: bool
    max_positions: int | None
    max_running: int
    experts: str = "bf16"  # the synthetic model's routed experts (model.EXPERTS)

    @property
    def synthetic(self) -> bool:
        """Whether the bench writes the model itself (no ``--model``)."""
        return self.model_dir is None

    def describe(self) -> str:
        """The model and what its case expects of the arms, for the report's model line."""
        layout = "NVFP4 experts, ModelOpt safetensors" if self.experts == "nvfp4" else "FTW, bf16 experts"
        name = f"synthetic qwen4_exp ({layout}, disk PLE table)" if self.synthetic else \
            f"{self.model_dir} ({self.family}, {self.architecture}{', dummy weights' if self.dummy else ''})"
        wait = ("its decode graphs hold a host-released WAIT (PLE wait-sync): the never-uploaded arms are the "
                "negative control" if self.expects_wait else
                "no decode graph holds a host-released WAIT: nothing needs protection, every shim arm must be "
                "a no-op")
        return f"{name}; expected: {wait}"


def synthetic_args(context: int, decode_steps: int) -> tuple[str, ...]:
    """FreeToken options for the synthetic qwen4_exp (engine and server alike): pure-triton attention
    (no flashinfer), resident bf16 experts, the disk PLE table, graphs for bs 1 and 2, and a KV cache
    sized for two requests of the workload instead of 0.9 of the GPU."""
    kv = max(8192, 1024 * math.ceil(2.5 * (context + decode_steps) / 1024))
    return ("--attention-backend", "qsa_sparse", "--moe-strategy", "fused", "--ple-backend", "disk",
            "--cuda-graph-max-bs", "2", "--max-running-requests", "2", "--num-tokens", str(kv),
            "--max-prefill-length", "1024", "--cache-type", "radix", "--text-model-only")


def synthetic(context: int, decode_steps: int, ft_args: Sequence[str] = (), experts: str = "bf16") -> Target:
    """The synthetic qwen4_exp with its own options, then the user's (after ``--``: the last of an
    option wins, so ``-- --moe-strategy offload`` replaces its resident experts), its routed experts
    in ``experts``'s layout."""
    return Target(None, (*synthetic_args(context, decode_steps), *ft_args), WAIT_FAMILY,
                  "Qwen4ExpForConditionalGeneration", dummy=False, expects_wait=True, max_positions=None,
                  max_running=2, experts=experts)


def check_synthetic(ft_args: Sequence[str]) -> None:
    """What the synthetic model's FreeToken options may not change, checked before FreeToken is
    imported: the options the bench owns, and what makes it the disk PLE table's case."""
    refuse_owned(ft_args)
    for arg in ft_args:
        name = arg.split("=", 1)[0]
        if read_as(name, SYNTHETIC_FIXED):
            raise TargetError(f"FreeToken option after --: {name}: the synthetic model runs the disk PLE table with "
                              "its real weights; leave it out, or bring a model with --model")


def read_config(model_dir: str) -> dict[str, Any]:
    """``config.json`` of ``model_dir``; ``TargetError`` naming the path when it is no model directory."""
    path = os.path.join(model_dir, "config.json")
    accepted = "accepted values are a model directory (config.json and a tokenizer: a checkpoint, or config-only " \
               "with -- --dummy-weight)"
    if not os.path.isdir(model_dir):
        what = "is not a directory" if os.path.exists(model_dir) else "does not exist"
        raise TargetError(f"--model {model_dir!r} {what}; {accepted}")
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except FileNotFoundError:
        raise TargetError(f"--model {model_dir!r}: no config.json there; {accepted}") from None
    except (OSError, UnicodeError, json.JSONDecodeError) as exc:
        raise TargetError(f"--model {model_dir!r}: config.json cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise TargetError(f"--model {model_dir!r}: config.json is not a JSON object")
    return config


def family(config: dict[str, Any]) -> tuple[str, str, int | None]:
    """(model_type, first architecture, max_position_embeddings), looking into ``text_config`` where a
    multimodal config keeps them."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    model_type = str(config.get("model_type") or text.get("model_type") or "unknown")
    architectures = config.get("architectures") or ["unknown"]
    positions = text.get("max_position_embeddings", config.get("max_position_embeddings"))
    return model_type, str(architectures[0]), int(positions) if isinstance(positions, int) else None


def parse_freetoken_args(model_dir: str, ft_args: list[str]) -> Any:
    """FreeToken's own ``ft serve`` parser over ``ft_args``; its error (argparse's usage error or an
    exception from resolving the options) becomes one ``TargetError`` line. FreeToken logs the parsed
    arguments to stdout: held back here, as are its INFO lines."""
    err = io.StringIO()
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:  # FreeToken's import logs and warns too (its own stdout handler, triton): held back with the rest
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from freetoken.server.args import parse_args

            args, _ = parse_args(["--model", model_dir, *ft_args], prog="ft serve")
    except SystemExit:
        lines = [ln for ln in err.getvalue().strip().splitlines() if ln.strip()]
        why = lines[-1].split("error: ", 1)[-1] if lines else "rejected"
        raise TargetError(f"FreeToken option after --: {why} (FreeToken's own ft serve options)") from None
    except ImportError:
        raise  # FreeToken (or a module it needs) is not installed: the CLI says which, in one line
    except Exception as exc:
        raise TargetError(f"FreeToken cannot use --model {model_dir!r} with {' '.join(ft_args) or 'its defaults'}: "
                          f"{type(exc).__name__}: {exc}") from None
    finally:
        logging.disable(before)
    return args


def precheck(model_dir: str, ft_args: list[str]) -> dict[str, Any]:
    """What can be checked before FreeToken is imported (seconds, on a machine without a GPU too):
    the options the bench owns, also abbreviated (FreeToken's parser takes ``--hos`` for ``--host``),
    and the model directory. Returns its config; ``TargetError`` in one line otherwise."""
    refuse_owned(ft_args)
    return read_config(model_dir)


def read_as(name: str, options: Sequence[str]) -> list[str]:
    """Those of ``options`` FreeToken's parser may read ``name`` as (argparse takes a prefix)."""
    return [o for o in options if name.startswith("--") and len(name) > 2 and o.startswith(name)]


def refuse_owned(ft_args: Sequence[str]) -> None:
    """The options the bench sets itself, also abbreviated: ``TargetError`` naming the first."""
    for arg in ft_args:
        name = arg.split("=", 1)[0]
        owned = read_as(name, BENCH_OWNS)
        if owned:
            reading = "" if name in BENCH_OWNS else f" (FreeToken reads it as {owned[0]})"
            raise TargetError(f"FreeToken option after --: {name}{reading}: the bench sets it itself; leave it out")


def from_model(model_dir: str, ft_args: list[str]) -> Target:
    """The ``--model`` target, refused in one line when it is no model or FreeToken rejects an option."""
    config = precheck(model_dir, ft_args)
    model_type, architecture, positions = family(config)
    args = parse_freetoken_args(model_dir, ft_args)
    dummy = bool(args.use_dummy_weight)
    expects_wait = model_type.startswith(WAIT_FAMILY) and not dummy and args.ple_backend == "disk"
    return Target(model_dir, tuple(ft_args), model_type, architecture, dummy, expects_wait, positions,
                  int(args.max_running_req))
