"""The models a real-engine benchmark (``bench engine``, ``bench serve``) runs, one case each: the
synthetic qwen4_exp at each ``--layers``, or ``--model``, with FreeToken's own options after ``--``;
refused in one line, before any engine starts, where they cannot run."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from . import model
from .target import Target, TargetError, check_synthetic, from_model, parse_freetoken_args, precheck, synthetic
from .target import synthetic_args as synthetic_options
from .workload import build, check, read_text, tokenizer_of


@dataclass(frozen=True)
class Case:
    """One model a real-engine bench runs: the target and the synthetic model's size (``None`` for
    ``--model``)."""

    target: Target
    layers: int | None

    @property
    def label(self) -> str:
        """How the report names the case: the synthetic model by its layers, a user's model by its folder."""
        nvfp4 = " nvfp4" if self.target.experts == "nvfp4" else ""
        return f"{self.layers} layers{nvfp4}" if self.target.synthetic else os.path.basename(
            os.path.normpath(self.target.model_dir or ""))

    @contextlib.contextmanager
    def model_dir(self, log_dir: str) -> Iterator[str]:
        """The model's directory: ``--model`` itself, or the synthetic model written under ``log_dir``
        for the run and removed after it."""
        if not self.target.synthetic:
            yield str(self.target.model_dir)
            return
        folder = tempfile.mkdtemp(prefix=f"graphfix-{self.layers}L-", dir=log_dir)
        try:
            model.build_model_dir(folder, int(self.layers or 0), experts=self.target.experts)
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Models:
    """What ``--model``, ``--layers``, ``--experts`` and the workload options asked for."""

    model: str | None
    layers: tuple[int, ...] | None
    experts: str
    context: int
    decode_steps: int
    prompt_file: str | None


def early_checks(asked: Models, ft_args: list[str]) -> str | None:
    """Input that can be refused before FreeToken (or torch) is imported: the prompt file, the options
    the bench owns, the model directory, ``--layers``; why not, in one line."""
    if asked.model is not None and asked.layers:
        return "--layers sizes the synthetic model; with --model it has no meaning"
    if asked.model is not None and asked.experts != "bf16":
        return "--experts lays out the synthetic model's experts; with --model it has no meaning"
    try:
        read_text(asked.prompt_file)
        if asked.model is not None:
            precheck(asked.model, ft_args)
        else:
            check_synthetic(ft_args)
            for layers in asked.layers or []:
                model.check_layers(layers)
    except TargetError as exc:
        return str(exc)
    except ValueError as exc:
        return f"--layers: {exc}" if asked.model is None and "layers=" in str(exc) else str(exc)
    return None


def prepare(asked: Models, ft_args: list[str]) -> tuple[list[Case], str | None]:
    """The cases to run: ``--model`` resolved through FreeToken's own parser, else the synthetic model at
    each ``--layers`` (48 by default) with the options after ``--``; and the workload checked against
    them. No cases and why not, in one line, where they cannot run."""
    try:
        text = read_text(asked.prompt_file)
        if asked.model is None:  # FreeToken's own parser over the synthetic model's options and the user's
            with tempfile.TemporaryDirectory() as folder:
                model.write_synthetic_config(folder, model.MIN_LAYERS, asked.experts)
                parse_freetoken_args(folder, [*synthetic_options(0, 0), *ft_args])
                model.write_tokenizer(folder)
                build(tokenizer_of(folder), asked.context, text)  # the prompts fit (built again per case)
        else:
            build(tokenizer_of(asked.model), asked.context, text)
        target = from_model(asked.model, ft_args) if asked.model is not None else None
        check(asked.context, asked.decode_steps, target.max_positions if target else None)
    except (TargetError, ValueError) as exc:
        return [], str(exc)
    if target is not None and not target.synthetic:
        return [Case(target, None)], None
    return [Case(synthetic(asked.context, asked.decode_steps, ft_args, asked.experts), layers)
            for layers in asked.layers or [48]], None

