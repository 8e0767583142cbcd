"""The synthetic qwen4_exp model that ``bench --engine`` (and ``--serve``) run FreeToken's engine on.

Seeded, nothing downloaded, in FreeToken's FTW layout: the geometry of FreeToken's own GPU toy, with
the layer count as the knob, the PLE table on the disk backend, so that in CUDA wait-sync mode every
decode graph starts with a WAIT released after its launch.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

MIN_LAYERS = 4  # a QSA layer is every 4th, the PLE layer is 1
VOCAB, EOS = 512, 7  # EOS is also the PLE n-gram hash boundary
PLE_LAYER = 1  # zero-based; config.json counts from one
PLE_PREFIX = f"model.language_model.layers.{PLE_LAYER}.ple.ple_embedding.ngram_embedding."
PLE_SCALE = 0.25  # bf16-exact
ENGINE = dict(  # SchedulerConfig fields the benchmarks set; the rest keep FreeToken's defaults
    attention_backend="qsa_sparse",  # pure triton: no flashinfer or sgl-kernel
    moe_strategy="fused",  # resident bf16 experts, triton fused MoE
    ple_backend="disk",  # DiskRowTable; FREETOKEN_PLE_SYNC=wait puts the WAIT in the graph
    max_running_req=2, cuda_graph_bs=[1, 2], cuda_graph_max_bs=2,
    num_token_override=8192,  # 128 KV pages, not 0.9 of the GPU
    max_extend_tokens=1024, cache_type="radix",
)


def text_config(layers: int) -> dict[str, Any]:
    """FreeToken's GPU toy (tests/models/qwen4_exp/common.py): GDN layers, every 4th QSA, PLE on layer 1."""
    return dict(
        model_type="qwen4_exp_text", num_hidden_layers=layers, hidden_size=128, vocab_size=VOCAB,
        head_dim=64, num_attention_heads=4, num_key_value_heads=1,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, output_gate_type="sigmoid",
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=64, indexer_budget=16, indexer_compress_ratio=4,
        hc_count=4, hc_lowrank=16,
        ple_layer_ids=[PLE_LAYER + 1], ple_embed_dim=64, ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2,
        ngram_vocab_size_base=1000, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=4,
        eos_token_id=EOS, bos_token_id=EOS)


def prompts() -> list[list[int]]:
    """Three 40-token prompts: distinct first tokens (no shared radix prefix), an EOS inside the first."""
    import torch

    g = torch.Generator().manual_seed(5)
    out = [torch.randint(8, VOCAB, (40,), generator=g).tolist() for _ in range(3)]
    out[0][17] = EOS
    for i, p in enumerate(out):
        p[0] = 100 + i
    return out


def meta_model(folder: str) -> tuple[Any, Any]:
    """(SchedulerConfig after the engine's own ``_adjust_config``, the model on the meta device)."""
    import torch
    from freetoken.distributed import DistributedInfo, set_tp_info, try_get_tp_info
    from freetoken.engine.engine import _adjust_config
    from freetoken.layers import rotary
    from freetoken.mm.config import ENCODER_KINDS, MultimodalConfig
    from freetoken.models import create_model
    from freetoken.scheduler.config import SchedulerConfig
    from freetoken.utils.torch_utils import torch_dtype

    if try_get_tp_info() is None:
        set_tp_info(rank=0, size=1)
    sc = SchedulerConfig(model_path=folder, tp_info=DistributedInfo(0, 1), dtype=torch.bfloat16, offline_mode=True,
                         mm=MultimodalConfig(disabled_encoders=frozenset(ENCODER_KINDS)), **ENGINE)
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


def check_layers(layers: int) -> None:
    if layers < MIN_LAYERS:
        raise ValueError(f"layers={layers}: need at least {MIN_LAYERS} (a QSA layer is every 4th, the PLE layer is 1)")


def build_model_dir(folder: str, layers: int, seed: int = 1234) -> dict[str, Any]:
    """Write config, tokenizer, FTW weights, bf16 expert banks and the PLE table into ``folder``.

    FTW, not a raw HF checkpoint: qwen4_exp reads bf16 routed experts only from FTW banks, and
    dummy weights would attach a ZeroTable (no WAIT) instead of the disk PLE table.
    """
    import torch
    from freetoken.checkpoint.ftw import FTWWriter
    from freetoken.models.qwen4_exp.ple import derive_ngram_hash_constants
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    check_layers(layers)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp",
                   "image_token_id": 248056, "tie_word_embeddings": False, "text_config": text_config(layers)}, fh)
    tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(VOCAB)}, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(folder, "tokenizer.json"))
    # every word an added token: qwen4_exp's config.json makes AutoTokenizer (FreeToken's
    # utils/hf.py load_tokenizer) build a Qwen3.5 BPE tokenizer, which drops the WordLevel words, so
    # a text prompt to ft serve would become zero or one token
    words = {str(i): {"content": f"<{i}>", "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False, "special": False} for i in range(VOCAB)}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"<{EOS}>", "model_max_length": 4096,
                   "added_tokens_decoder": words}, fh)

    sc, model = meta_model(folder)
    mc, a4 = sc.model_config, sc.model_config.qwen4_args
    mult, sizes, offs = derive_ngram_hash_constants(
        vocab_size=VOCAB, ngram_size=a4.ngram_size, num_ngram_heads=a4.num_ngram_heads,
        ngram_vocab_size_base=a4.ngram_vocab_size_base, ple_layer_index=0)
    hash_buffers = {"layer_multipliers": mult, "ngram_heads_vocab_sizes": sizes, "ngram_heads_offsets": offs}
    g = torch.Generator().manual_seed(seed)
    writer = FTWWriter(folder)
    for name, t in model.state_dict().items():  # exactly the model's state dict
        if t.dtype == torch.int64:  # the PLE hash buffers ship in the checkpoint
            writer.add_tensor(name, torch.tensor(hash_buffers[name.rsplit(".", 1)[1]]), kind="weight")
        else:
            writer.add_tensor(name, random_weight(name, tuple(t.shape), t.dtype, g), kind="weight")
    n, h, i = mc.num_moe_layers * mc.num_experts, mc.hidden_size, mc.moe_intermediate_size
    writer.add_tensor("gate_up", (torch.randn(n, 2 * i, h, generator=g) / math.sqrt(h)).bfloat16(),
                      kind="experts_bank")
    writer.add_tensor("down", (torch.randn(n, h, i, generator=g) / math.sqrt(i)).bfloat16(), kind="experts_bank")
    rows = -(-(offs[-1] + sizes[-1]) // a4.split_ngram_parts)
    shards = [(torch.randn(rows, a4.ngram_head_dim, generator=g) * 2).to(torch.float8_e4m3fn)
              for _ in range(a4.split_ngram_parts)]
    ple = {PLE_PREFIX + f"shard_{k}.weight": s for k, s in enumerate(shards)}
    ple[PLE_PREFIX + "weight_scale"] = torch.tensor(PLE_SCALE, dtype=torch.bfloat16)
    save_file(ple, os.path.join(folder, "ple-table-00000.safetensors"), metadata={"format": "pt"})
    writer.finalize({"source_model_path": "synthetic (freetoken_graphfix bench --engine)", "fingerprint": None,
                     "quant_format": "bf16", "layer_quant_formats": None,
                     "expert_bank_num_layers": mc.num_moe_layers, "side_files": ["ple-table-00000.safetensors"]})
    return {"config": sc, "model": model, "rows": rows, "shards": shards}
