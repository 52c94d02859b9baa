"""The native RoPE tables (four raw fp32 `[rows, rope_dim / 2]` files and rope.json) against a
numpy float32 computation of the same definition; the largest difference is reported in ulps."""
import hashlib
import json
import math

import numpy as np
import pytest

from conftest import run

FILES = ["rope-plain-cos.f32", "rope-plain-sin.f32", "rope-compressed-cos.f32", "rope-compressed-sin.f32"]
MAX_ULP = 2

REAL = {
    "model_type": "deepseek_v41", "bos_token_id": 0, "eos_token_id": 1,
    "quantization_config": {"quant_method": "exl3", "codebook": "mul1"},
    "text_config": {
        "vocab_size": 129280, "hidden_size": 5120, "moe_intermediate_size": 2304, "num_hidden_layers": 40,
        "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1280,
        "o_lora_rank": 1024, "o_groups": 8, "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
        "max_position_embeddings": 1048576, "rope_theta": 10000,
        "rope_scaling": {"factor": 16, "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 65536},
        "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 6, "routed_scaling_factor": 1.5,
        "sliding_window": 128, "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
        "compress_rope_theta": 160000, "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36], "index_n_heads": 32, "index_head_dim": 128,
        "index_topk": 512, "candidate_source_layer_id": 20, "candidate_topk_blocks": 2048,
        "candidate_block_size": 8, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06,
        "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682], "engram_max_ngram_size": 4,
        "engram_vocab_size": 16000000, "engram_n_heads": 8, "engram_head_dim": 256, "engram_pad_token_id": 2,
        "engram_compressed_vocab_size": 99092, "num_nextn_predict_layers": 3, "dspark_block_size": 5,
        "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256,
        "dspark_n_routed_experts": 128, "dspark_num_experts_per_tok": 3},
}


def freqs(dim, base, factor, beta_fast, beta_slow, orig_len):
    """The tables' YaRN frequencies in numpy float32 (corr/low/high in Python floats, as the
    definition's Python does)."""
    f32 = np.float32
    # base ** (i / dim), correctly rounded to float32: computed in float64 and rounded once
    # (numpy's float32 power is not correctly rounded on every version; the exponent i / dim is
    # exact in float32 for the even dims used here).
    exponent = np.arange(0, dim, 2, dtype=np.float32) / f32(dim)
    f = f32(1.0) / np.power(np.float64(base), exponent.astype(np.float64)).astype(np.float32)
    if orig_len > 0:
        def corr(r):
            return dim * math.log(orig_len / (r * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr(beta_fast)), 0)
        high = min(math.ceil(corr(beta_slow)), dim - 1)
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - f32(low)) / f32(max(high - low, 0.001)), 0, 1)
        ramp = ramp.astype(np.float32)
        f = f / f32(factor) * ramp + f * (f32(1) - ramp)
    return f.astype(np.float32)


def tables(cfg, rows, compressed):
    """numpy float32 cos/sin of the fp32 angles, and the same angles' cos/sin computed in float64
    and rounded once (a correctly rounded reference, to tell whose last bit is off)."""
    t = cfg.get("text_config", cfg)
    rs = t["rope_scaling"]
    base = t["compress_rope_theta"] if compressed else t["rope_theta"]
    f = freqs(t["qk_rope_head_dim"], base, rs["factor"], rs["beta_fast"], rs["beta_slow"],
              rs["original_max_position_embeddings"])
    angle = np.outer(np.arange(rows, dtype=np.float32), f).astype(np.float32)
    a64 = angle.astype(np.float64)
    return (np.cos(angle), np.sin(angle)), (np.cos(a64).astype(np.float32), np.sin(a64).astype(np.float32))


def ulps(a, b):
    def ordered(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(2**31) - i, i)
    return np.abs(ordered(a) - ordered(b))


def check(sd_inputs, model_dir, out, rows):
    cfg = json.loads((model_dir / "config.json").read_text())
    printed = json.loads(run(sd_inputs, "rope", model_dir, out, rows).stdout)
    meta = json.loads((out / "rope.json").read_text())
    assert meta == printed
    half = cfg.get("text_config", cfg)["qk_rope_head_dim"] // 2
    assert meta["half"] == half and meta["rows"] == rows
    worst, exact = {}, {}
    for compressed in (False, True):
        want, rounded = tables(cfg, rows, compressed)
        for part, w, r in zip(("cos", "sin"), want, rounded):
            name = f"rope-{'compressed' if compressed else 'plain'}-{part}.f32"
            raw = (out / name).read_bytes()
            assert hashlib.sha256(raw).hexdigest() == meta[name]
            got = np.frombuffer(raw, dtype="<f4").reshape(rows, half)
            d = ulps(got, w)
            worst[name] = (int(d.max()), float(np.mean(d > 0)))
            e = ulps(got, r)
            exact[name] = (int(e.max()), float(np.mean(e > 0)))
    print(f"\nrows={rows}: max ulp vs numpy float32 (fraction differing): {worst}")
    print(f"rows={rows}: max ulp vs float64-rounded (fraction differing): {exact}")
    assert max(w for w, _ in exact.values()) <= 1, exact
    return worst


def test_rope_small_checkpoint(sd_inputs, small_checkpoint, tmp_path):
    from pathlib import Path
    worst = check(sd_inputs, Path(small_checkpoint["model_dir"]), tmp_path / "kit", 5120)
    assert max(w for w, _ in worst.values()) <= MAX_ULP, worst


def test_rope_real_parameters(sd_inputs, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(REAL))
    worst = check(sd_inputs, model, tmp_path / "kit", 131072)
    assert max(w for w, _ in worst.values()) <= MAX_ULP, worst


def test_rope_json_mismatch_is_refused(sd_inputs, small_checkpoint, tmp_path):
    from pathlib import Path
    kit = tmp_path / "kit"
    check(sd_inputs, Path(small_checkpoint["model_dir"]), kit, 64)
    meta = json.loads((kit / "rope.json").read_text())
    meta["rope-plain-sin.f32"] = "0" * 64
    (kit / "rope.json").write_text(json.dumps(meta))
    r = run(sd_inputs, "rope", small_checkpoint["model_dir"], kit, check=False)
    assert r.returncode != 0 and "download the kit" in r.stderr, r.stderr
