"""A stand-in for FreeToken's ``tests/models/qwen4_exp/common.py``, which its wheel does not ship.

The patch series' tests import four names from it: ``EOS``, ``requires_cuda``, ``hash_constants``
and ``toy_hf_config``. ``source()`` is a ``common.py`` giving them, for a checkout made from the
0.2.1 wheel: the toy qwen4_exp geometry this package's synthetic model also uses (hidden 128, a PLE
table of 4 heads x 16 bytes over 4,064 rows), its ``eos`` FreeToken's test id 7, and the hash
constants FreeToken derives itself. Where FreeToken's repository is at hand (its own tests on the
GPU machine), the real file is used instead.
"""

from __future__ import annotations

from freetoken_graphfix_bench.model import VOCAB, text_config

EOS = 7
TEMPLATE = '''"""Stand-in for FreeToken's tests/models/qwen4_exp/common.py (written by freetoken-graphfix's tests)."""

from types import SimpleNamespace

import pytest
import torch

EOS = {eos}
VOCAB = {vocab}
TEXT = {text!r}

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def toy_hf_config():
    return SimpleNamespace(model_type="qwen4_exp", architectures=["Qwen4ExpForConditionalGeneration"],
                           text_config=SimpleNamespace(**TEXT), quantization_config=None)


def hash_constants(args):
    from freetoken.models.qwen4_exp.ple import derive_ngram_hash_constants

    values = derive_ngram_hash_constants(vocab_size=VOCAB, ngram_size=args.ngram_size,
                                         num_ngram_heads=args.num_ngram_heads,
                                         ngram_vocab_size_base=args.ngram_vocab_size_base, ple_layer_index=0)
    return [torch.tensor(v, dtype=torch.int64) for v in values]
'''


def source() -> str:
    """The stand-in ``common.py``'s text."""
    text = {**text_config(4), "eos_token_id": EOS, "bos_token_id": EOS}
    return TEMPLATE.format(eos=EOS, vocab=VOCAB, text=text)
