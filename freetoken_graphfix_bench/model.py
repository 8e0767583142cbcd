"""The models the real-engine benches run when the user brings none, written into a directory.

The synthetic qwen4_exp (``build_model_dir``): seeded, nothing downloaded, in FreeToken's FTW layout
with bf16 experts or as a ModelOpt NVFP4 export (``--experts nvfp4``, #775's layout), the geometry of
FreeToken's own GPU toy with the layer count as the knob and the PLE table on the disk backend, so
that in CUDA wait-sync mode every decode graph starts with a WAIT released after its launch. And
config-only models of other families (``write_config_model``: llama, qwen3, qwen3_moe) for
``ft serve --dummy-weight``: none of their graphs holds such a WAIT. Every one gets the same small
byte-level BPE tokenizer, trained (deterministically) on the workload's own text, so that text
prompts round-trip through FreeToken's ``load_tokenizer`` whatever class it picks for the family.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from .workload import COPY_TEXT

MIN_LAYERS = 4  # a QSA layer is every 4th, the PLE layer is 1
VOCAB, EOS = 512, 0  # the tokenizer's size; EOS (its one special token) is also the PLE n-gram hash boundary
MAX_POSITIONS = 131072  # room for #775's 64K context
PLE_LAYER = 1  # zero-based; config.json counts from one
PLE_PREFIX = f"model.language_model.layers.{PLE_LAYER}.ple.ple_embedding.ngram_embedding."
PLE_SCALE = 0.25  # bf16-exact
PLE_FILE = "ple-table-00000.safetensors"
HF_TEXT_PREFIX = "model.language_model."  # the HF checkpoint's text-model prefix (qwen3_vl rename_vl_prefix)
NVFP4_BLOCK = 16  # elements per FP8 block scale
SYNTHETIC = "qwen4_exp"
# config-only families for --dummy-weight: the shape of a small release of each (layers: the default)
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048,
                  intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=2048, intermediate_size=6144,
                  num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen3_moe": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
                      intermediate_size=6144, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4,
                      head_dim=128, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=384,
                      decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, rms_norm_eps=1e-6,
                      rope_theta=1000000.0, tie_word_embeddings=False),
}
ENGINE_FLAGS = {  # the FreeToken options each written model is meant to run with (after --)
    SYNTHETIC: "--attention-backend qsa_sparse --moe-strategy fused --text-model-only",
    **{name: "--dummy-weight --attention-backend triton" for name in FAMILIES},
}


def text_config(layers: int) -> dict[str, Any]:
    """FreeToken's GPU toy (tests/models/qwen4_exp/common.py): GDN layers, every 4th QSA, PLE on layer 1."""
    return dict(
        model_type="qwen4_exp_text", num_hidden_layers=layers, hidden_size=128, vocab_size=VOCAB,
        head_dim=64, num_attention_heads=4, num_key_value_heads=1,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, output_gate_type="sigmoid",
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=64, indexer_budget=16, indexer_compress_ratio=4,
        hc_count=4, hc_lowrank=16,
        ple_layer_ids=[PLE_LAYER + 1], ple_embed_dim=64, ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2,
        ngram_vocab_size_base=1000, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=4,
        eos_token_id=EOS, bos_token_id=EOS)


def write_synthetic_config(folder: str, layers: int, experts: str = "bf16") -> None:
    """The synthetic qwen4_exp's ``config.json``; with ``nvfp4`` experts a ModelOpt
    ``quantization_config`` that quantizes the routed experts alone (``MIXED_PRECISION``: every other
    module stays bf16, as FreeToken's qwen4_exp reader expects of the dense part)."""
    config: dict[str, Any] = {"architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp",
                              "image_token_id": 248056, "tie_word_embeddings": False,
                              "text_config": text_config(layers)}
    if experts == "nvfp4":
        config["quantization_config"] = {
            "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {f"{HF_TEXT_PREFIX}layers.{n}.mlp.experts": {"quant_algo": "NVFP4"}
                                 for n in range(layers)}}
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)


def meta_model(folder: str) -> tuple[Any, Any]:
    """(the synthetic model's configuration as FreeToken's own ``ft serve`` parser makes it from the
    options every bench runs it with, after the engine's own ``_adjust_config``; the model on the meta
    device)."""
    import torch
    from freetoken.distributed import set_tp_info, try_get_tp_info
    from freetoken.engine.engine import _adjust_config
    from freetoken.layers import rotary
    from freetoken.models import create_model
    from freetoken.utils.torch_utils import torch_dtype

    from .target import parse_freetoken_args, synthetic_args

    if try_get_tp_info() is None:
        set_tp_info(rank=0, size=1)
    sc = parse_freetoken_args(folder, list(synthetic_args(0, 0)))
    _adjust_config(sc)
    rotary.set_rope_device(torch.device("cpu"))  # get_rope refuses the meta device
    with torch.device("meta"), torch_dtype(torch.bfloat16):
        return sc, create_model(sc.model_config)


def random_weight(name: str, shape: tuple[int, ...], dtype: Any, g: Any) -> Any:
    """Finite, O(1)-activation random init by the parameter's role."""
    import torch

    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(1, 16, generator=g).log().to(dtype)
    if name.endswith("dt_bias"):
        return (torch.randn(shape, generator=g) * 0.1).to(dtype)
    if name.endswith("linear_attn.norm.weight"):  # GatedRMSNorm: w * x
        return (1 + 0.02 * torch.randn(shape, generator=g)).to(dtype)
    if "norm" in name.rsplit(".", 2)[-2]:  # zero-centred (1 + w) norms
        return (0.02 * torch.randn(shape, generator=g)).to(dtype)
    if name.endswith("conv1d.weight"):
        return (0.3 * torch.randn(shape, generator=g)).to(dtype)
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=g).to(dtype)
    if len(shape) == 2:  # Linear [out, in]
        return (torch.randn(shape, generator=g) / math.sqrt(shape[1])).to(dtype)
    return (0.02 * torch.randn(shape, generator=g)).to(dtype)


def write_tokenizer(folder: str) -> None:
    """A byte-level BPE tokenizer of ``VOCAB`` ids trained on the workload's text, EOS its only special
    token, with a chat template (without one FreeToken's ``load_tokenizer`` asks the Hugging Face hub
    for ``chat_template.json``: about 30 s of retries on a machine without network)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([COPY_TEXT.read_text(encoding="utf-8")], trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert tok.token_to_id("<|endoftext|>") == EOS and tok.get_vocab_size() == VOCAB
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "model_max_length": MAX_POSITIONS,
                   "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}, fh)


def write_config_model(folder: str, family: str, layers: int | None = None) -> None:
    """``config.json`` of a small ``family`` model (``FAMILIES``; ``layers`` overrides its default) and
    the tokenizer: a model directory for ``--dummy-weight``, no weights."""
    config = dict(FAMILIES[family], vocab_size=VOCAB, max_position_embeddings=MAX_POSITIONS, torch_dtype="bfloat16",
                  hidden_act="silu", bos_token_id=EOS, eos_token_id=EOS)
    if layers is not None:
        config["num_hidden_layers"] = layers
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)
    write_tokenizer(folder)


def write_model(folder: str, family: str, layers: int | None, experts: str = "bf16") -> str:
    """``bench write-model``: the synthetic qwen4_exp (``layers``, default 48; routed experts in
    ``experts``'s layout) or a config-only ``family`` model into ``folder``, a new or empty directory;
    all or nothing (written beside it, then renamed). Returns the line that says how to run it."""
    check_experts(experts)
    if family != SYNTHETIC and experts != "bf16":
        raise ValueError(f"--experts {experts} is for the synthetic {SYNTHETIC} (--family {SYNTHETIC}); a "
                         f"config-only {family} model has dummy weights")
    if family == SYNTHETIC:
        check_layers(48 if layers is None else layers)
    elif layers is not None and layers < 1:
        raise ValueError(f"--layers {layers}: accepted values are 1 or more")
    if not folder:
        raise ValueError("write-model '': accepted values are a new or empty directory")
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and not (os.path.isdir(folder) and not os.listdir(folder)):
        raise ValueError(f"write-model {folder!r} already exists and is not an empty directory; accepted values "
                         "are a new or empty directory")
    parent = os.path.dirname(folder)
    try:
        os.makedirs(parent, exist_ok=True)  # bench write-model /tmp/models/q4 on a fresh machine
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.", dir=parent)
    except OSError as exc:
        raise ValueError(f"write-model {folder!r}: cannot write in {parent!r} ({exc.strerror}); accepted values "
                         "are a new or empty directory in a writable one") from None
    try:
        with quiet_freetoken():
            if family == SYNTHETIC:
                build_model_dir(staging, 48 if layers is None else layers, experts=experts)
            else:
                write_config_model(staging, family, layers)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 is for the staging, not for the model
        if os.path.isdir(folder):
            os.rmdir(folder)
        os.rename(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return (f"wrote a {family} model to {folder}; run it with: freetoken-graphfix bench engine "
            f"--model {folder} -- {ENGINE_FLAGS[family]}")


@contextlib.contextmanager
def quiet_freetoken() -> Iterator[None]:
    """FreeToken's own INFO/WARNING lines (its stdout handler) and warnings while its code builds a
    model: the one line ``write-model`` prints is the report. Errors still show."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


def check_layers(layers: int) -> None:
    """Refuse a layer count the synthetic model cannot be built with, before anything is written."""
    if layers < MIN_LAYERS:
        raise ValueError(f"layers={layers}: need at least {MIN_LAYERS} (a QSA layer is every 4th, the PLE layer is 1)")


EXPERTS = ("bf16", "nvfp4")  # --experts: the routed experts' layout
E2M1_RMS = math.sqrt(68.5 / 8)  # RMS of the 8 FP4 (e2m1) magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6: uniform random codes


def check_experts(experts: str) -> None:
    """Refuse an expert layout the synthetic model has no writer for, naming the accepted ones."""
    if experts not in EXPERTS:
        raise ValueError(f"--experts {experts}: accepted values are {', '.join(EXPERTS)}")


def build_model_dir(folder: str, layers: int, seed: int = 1234, experts: str = "bf16") -> dict[str, Any]:
    """Write config, tokenizer, weights, routed experts and the PLE table into ``folder``.

    ``bf16`` experts: an FTW checkpoint, since qwen4_exp reads bf16 routed experts only from FTW banks
    (dummy weights would attach a ZeroTable, no WAIT, instead of the disk PLE table). ``nvfp4``: the
    layout of an NVIDIA ModelOpt export (#775's Qwen3.8-Flash-Next-NVFP4), which FreeToken reads
    straight from safetensors (``models/qwen4_exp/weight.py``: ``iter_weights`` for the dense part,
    ``nvfp4_expert_spec`` for the experts): per-expert ``gate_proj``/``up_proj``/``down_proj`` FP4
    codes, FP8 block scales and an FP32 global scale, the rest bf16 under the HF names.
    """
    import torch
    from freetoken.models.qwen4_exp.ple import derive_ngram_hash_constants
    from safetensors.torch import save_file

    check_layers(layers)
    check_experts(experts)
    write_synthetic_config(folder, layers, experts)
    write_tokenizer(folder)

    sc, model = meta_model(folder)
    mc, a4 = sc.model_config, sc.model_config.qwen4_args
    mult, sizes, offs = derive_ngram_hash_constants(
        vocab_size=VOCAB, ngram_size=a4.ngram_size, num_ngram_heads=a4.num_ngram_heads,
        ngram_vocab_size_base=a4.ngram_vocab_size_base, ple_layer_index=0)
    hash_buffers = {"layer_multipliers": mult, "ngram_heads_vocab_sizes": sizes, "ngram_heads_offsets": offs}
    g = torch.Generator().manual_seed(seed)
    dense = {}
    for name, t in model.state_dict().items():  # exactly the model's state dict
        if t.dtype == torch.int64:  # the PLE hash buffers ship in the checkpoint
            dense[name] = torch.tensor(hash_buffers[name.rsplit(".", 1)[1]])
        else:
            dense[name] = random_weight(name, tuple(t.shape), t.dtype, g)
    rows = -(-(offs[-1] + sizes[-1]) // a4.split_ngram_parts)
    shards = [(torch.randn(rows, a4.ngram_head_dim, generator=g) * 2).to(torch.float8_e4m3fn)
              for _ in range(a4.split_ngram_parts)]
    ple = {PLE_PREFIX + f"shard_{k}.weight": s for k, s in enumerate(shards)}
    ple[PLE_PREFIX + "weight_scale"] = torch.tensor(PLE_SCALE, dtype=torch.bfloat16)
    save_file(ple, os.path.join(folder, PLE_FILE), metadata={"format": "pt"})
    (write_nvfp4_checkpoint if experts == "nvfp4" else write_ftw_checkpoint)(folder, dense, mc, g)
    return {"config": sc, "model": model, "rows": rows, "shards": shards}


def write_ftw_checkpoint(folder: str, dense: dict[str, Any], mc: Any, g: Any) -> None:
    """The dense weights under the model's own names and bf16 expert banks, in FreeToken's FTW."""
    import torch
    from freetoken.checkpoint.ftw import FTWWriter

    writer = FTWWriter(folder)
    for name, t in dense.items():
        writer.add_tensor(name, t, kind="weight")
    n, h, i = mc.num_moe_layers * mc.num_experts, mc.hidden_size, mc.moe_intermediate_size
    writer.add_tensor("gate_up", (torch.randn(n, 2 * i, h, generator=g) / math.sqrt(h)).bfloat16(),
                      kind="experts_bank")
    writer.add_tensor("down", (torch.randn(n, h, i, generator=g) / math.sqrt(i)).bfloat16(), kind="experts_bank")
    writer.finalize({"source_model_path": "synthetic (freetoken-graphfix bench engine)", "fingerprint": None,
                     "quant_format": "bf16", "layer_quant_formats": None,
                     "expert_bank_num_layers": mc.num_moe_layers, "side_files": [PLE_FILE]})


def write_nvfp4_checkpoint(folder: str, dense: dict[str, Any], mc: Any, g: Any) -> None:
    """A ModelOpt-style safetensors checkpoint: the dense weights under the HF names
    (``model.language_model.``, the names ``iter_weights`` maps back to the model's own) and every
    routed expert's projections in NVFP4, scaled so that a projection's output keeps its input's RMS."""
    import torch
    from safetensors.torch import save_file

    h, i = mc.hidden_size, mc.moe_intermediate_size
    tensors = {HF_TEXT_PREFIX + name.removeprefix("model.") if name.startswith("model.") else name: t
               for name, t in dense.items()}
    for layer in range(mc.num_layers):
        for expert in range(mc.num_experts):
            prefix = f"{HF_TEXT_PREFIX}layers.{layer}.mlp.experts.{expert}."
            for proj, (rows, cols) in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
                tensors[prefix + proj + ".weight"] = torch.randint(0, 256, (rows, cols // 2), generator=g,
                                                                   dtype=torch.uint8)  # two e2m1 codes a byte
                tensors[prefix + proj + ".weight_scale"] = (
                    0.75 + 0.5 * torch.rand(rows, cols // NVFP4_BLOCK, generator=g)).to(torch.float8_e4m3fn)
                tensors[prefix + proj + ".weight_scale_2"] = torch.tensor(1 / (math.sqrt(cols) * E2M1_RMS))
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
