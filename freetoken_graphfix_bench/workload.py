"""#775's decode workload: copy a text verbatim out of a long context, greedy, a fixed number of steps.

The context is real text (the Apache License 2.0 that ships beside this module as ``copy_text.txt``,
or ``--prompt-file``), repeated as needed and cut to exactly ``--context`` tokens of the model's own
tokenizer (FreeToken's ``load_tokenizer``), between an instruction to copy it and a cue to begin.
Each request starts at another place in the text, so no two share a prefix beyond the instruction:
the radix cache would otherwise skip most of the second request's prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

COPY_TEXT = Path(__file__).with_name("copy_text.txt")
INSTRUCTION = "Copy the following file verbatim, character for character.\n\n<file>\n"
CUE = "\n</file>\n\nThe same file again, verbatim:\n<file>\n"
SINGLE, PAIR = "single", ("left", "right")  # bs 1 runs the single request, bs 2 the pair at once
DEFAULT_CONTEXT = 4096
DEFAULT_STEPS = 200  # #775's window


@dataclass(frozen=True)
class Prompt:
    """One request: its token ids (what the offline engine takes) and their text (what a server takes)."""

    name: str
    ids: list[int]
    text: str


def read_text(path: str | None) -> str:
    """The text to copy: ``path``, or the one this package ships. Raises ``ValueError`` naming the file."""
    if path == "":
        raise ValueError("--prompt-file '': an empty path; accepted values are a UTF-8 text file")
    source = Path(path) if path is not None else COPY_TEXT
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"--prompt-file {str(source)!r}: cannot be read as UTF-8 text "
                         f"({getattr(exc, 'strerror', None) or exc})") from None
    if not text.strip():
        raise ValueError(f"--prompt-file {str(source)!r}: the file is empty; accepted values are a UTF-8 text file")
    return text


def load_tokenizer(model_dir: str) -> Any:
    """The model's tokenizer as FreeToken loads it (``freetoken.utils.hf.load_tokenizer``)."""
    from freetoken.utils.hf import load_tokenizer as freetoken_tokenizer

    return freetoken_tokenizer(model_dir)


def tokenizer_of(model_dir: str) -> Any:
    """``load_tokenizer``, its failure (no tokenizer files, a broken one) as a ``ValueError`` in one
    line naming the directory, before any engine starts."""
    try:
        return load_tokenizer(model_dir)
    except ModuleNotFoundError:
        raise  # FreeToken (or what it needs) is missing: the CLI names the module to install
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... by what is missing
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"--model {model_dir!r}: FreeToken cannot load its tokenizer ({type(exc).__name__}: "
                         f"{first}); accepted values are a model directory with its tokenizer") from None


def build(tokenizer: Any, context: int, text: str) -> dict[str, Prompt]:
    """The three requests, each exactly ``context`` tokens: the instruction, ``text`` from its own
    starting point (repeated as often as needed), the cue. Raises ``ValueError`` when ``context``
    cannot hold the instruction and the cue, or the text holds no token."""
    head = tokenizer.encode(INSTRUCTION, add_special_tokens=False)
    tail = tokenizer.encode(CUE, add_special_tokens=False)
    room = context - len(head) - len(tail)
    if room < 1:
        raise ValueError(f"--context {context}: too short for the copy instruction; accepted values are "
                         f"{len(head) + len(tail) + 1} tokens or more for this tokenizer")
    body = tokenizer.encode(text, add_special_tokens=False)
    if not body:
        raise ValueError("the text to copy encodes to no token")
    prompts = {}
    for i, name in enumerate((SINGLE, *PAIR)):
        start = i * len(body) // 3
        repeats = -(-(start + room) // len(body))
        ids = head + (body * repeats)[start:start + room] + tail
        prompts[name] = Prompt(name, ids, tokenizer.decode(ids))
    return prompts


def check(context: int, decode_steps: int, max_positions: int | None) -> None:
    """Refuse a workload the model cannot hold, in one line naming both options."""
    if max_positions is not None and context + decode_steps > max_positions:
        raise ValueError(f"--context {context} + --decode-steps {decode_steps} = {context + decode_steps} tokens: "
                         f"the model holds at most {max_positions} (its max_position_embeddings)")
