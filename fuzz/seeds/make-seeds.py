#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from the repository's own fixtures and
small valid inputs of every format (re-run after a format changes; the output is committed)."""
import json
import pathlib
import struct

root = pathlib.Path(__file__).resolve().parents[2]
out = root / "fuzz" / "corpus"
facts = root / "tests" / "fixtures" / "host-facts" / "h200x2"


def put(target, name, data):
    d = out / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


# config_toml: the shipped template, small documents, environment overrides after a NUL.
template = (root / "crates/spark-deploy-core/src/config/template.toml").read_text()
put("config_toml", "template", template)
put("config_toml", "empty-with-env", "\0WORKER=ops@192.0.2.2\nCONTEXT=262144\nPARALLEL=2\nMAX_TOKENS=4096\n")
put("config_toml", "serving", '[serving]\ncontext = 262144\nparallel = 2\nmax_tokens = 8192\nport = 8000\n')
put("config_toml", "nodes", '[[nodes]]\nname = "head"\nssh = ""\n[[nodes]]\nname = "worker"\nssh = "ops@192.0.2.2"\nfabric_addr = "10.0.0.2"\n')
put("config_toml", "hub", '[hub]\nendpoint = "http://127.0.0.1:9/"\ncache = "~/.cache/huggingface"\n\0HF_ENDPOINT=http://127.0.0.1:9\n')
env_names = "WORKER FABRIC_PEER WORKER_HF_CACHE MODEL_ID MODEL_REVISION SERVED_NAME ABLIT ABLIT_ID ABLIT_REVISION CONTEXT PARALLEL PORT MAX_TOKENS THINKING IMAGE MASTER_PORT WORKER_WEIGHTS NFS_VOLUME HEAD_NFS_SERVER PREPARE MIN_AVAIL_GIB LOG_KEEP WAIT_TIMEOUT STOP_TIMEOUT".split()
put("config_toml", "every-env-name", "\0" + "".join(f"{n}=1\n" for n in env_names))

# recipe_import: `.env`, NUL, `scripts/local.sh`.
put("recipe_import", "recipe", "CONTEXT=262144\nPARALLEL=2 # fewer\nFOO=bar\n\0# comment\nexport WORKER=\"ops@192.0.2.2\"\nCONTEXT=524288\nHF_TOKEN='hf_abc'\nrm -rf /\nMODEL_ID=\"$HOME/x\"\n")
put("recipe_import", "env-only", "MAX_TOKENS=4096\nMODEL_REVISION=main\nPORT=8000\nTHINKING=1\n")
put("recipe_import", "every-env-name", "\0" + "".join(f"export {n}='1'\n" for n in env_names))


# safetensors_header: small valid files (length prefix, padded header, data).
def safetensors(tensors, metadata=None):
    obj, at, data = {}, 0, b""
    if metadata:
        obj["__metadata__"] = metadata
    for name, dtype, shape, size in tensors:
        n = size
        for d in shape:
            n *= d
        obj[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(obj).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(at)


put("safetensors_header", "one", safetensors([("t", "U8", [10], 1)]))
put("safetensors_header", "mixed", safetensors([("b", "BF16", [2, 3], 2), ("a", "I16", [4], 2), ("e", "F32", [0], 4)], {"format": "pt"}))
put("safetensors_header", "exl3", safetensors([("l.trellis", "I16", [2, 3, 48], 2), ("l.suh", "F16", [32], 2), ("l.svh", "F16", [48], 2)]))
put("safetensors_header", "zero-size", safetensors([("z", "F32", [4611686018427387904, 4, 0], 4)]))
put("safetensors_header", "empty", safetensors([]))


# rank_file_index: data, index, u64 LE data length, magic.
def rank_file(rows):
    data_len = sum(r[4] for r in rows)
    index = "[" + ", ".join(f'["{k}", "{d}", [{", ".join(map(str, s))}], {o}, {b}]' for k, d, s, o, b in rows) + "]"
    return bytes(data_len) + index.encode() + struct.pack("<Q", data_len) + b"TFDSRK01"


put("rank_file_index", "three-rows", rank_file([
    ("embed.weight|None", "bfloat16", [4, 8], 0, 64),
    ("layers.0.attn.wq_b|(0, 16384)|None|tr", "int16", [2, 3, 48], 64, 576),
    ("layers.0.attn.attn_sink|torch.float32", "float32", [64], 640, 256),
]))
put("rank_file_index", "empty-index", rank_file([]))
put("rank_file_index", "index-text", '[["a", "float32", [2], 0, 8], ["b", "uint8", [0, 3], 8, 0]]')

# model_config: the real checkpoint's config (the fields the engine reads) and a test-scale one.
flash = (root / "crates/spark-deploy-core/src/engine/tensorfold/inputs/model_config.rs").read_text()
flash = flash.split('pub(crate) const FLASH: &str = r#"', 1)[1].split('"#;', 1)[0]
put("model_config", "flash", flash)
small = json.loads(flash)
tc = small["text_config"]
tc.update({"num_hidden_layers": 4, "num_nextn_predict_layers": 2, "hidden_size": 256, "vocab_size": 1024,
           "num_attention_heads": 4, "head_dim": 64, "q_lora_rank": 128, "o_lora_rank": 64, "o_groups": 2,
           "n_routed_experts": 16, "dspark_n_routed_experts": 8, "moe_intermediate_size": 256,
           "compress_ratios": [0, 2, 1, 0, 0, 0], "kv_source_layer_ids": [1, 2], "index_source_layer_ids": [1, 2, 3],
           "engram_layer_ids": [1, 3], "engram_num_embeddings": [5003, 5011], "engram_n_heads": 4,
           "engram_head_dim": 64, "dspark_target_layer_ids": [1, 2, 3], "candidate_source_layer_id": 2})
put("model_config", "small", json.dumps(small))

# Host facts: the real captures, and small synthetic ones.
host = (facts / "host-facts.txt").read_text()
put("host_meminfo", "h200x2-host-facts", host)
put("host_meminfo", "meminfo", "MemTotal:       263998500 kB\nMemFree:         1000 kB\nMemAvailable:   263415560 kB\n")
put("host_df", "df", "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/nvme0n1p2 3000000 1000000 2000000 34% /\n")
put("host_df", "df-mount-with-spaces", "/dev/x 3000000 1000000 2000000 34% /mnt/my disk\n")
put("host_df", "sizes", "model-00001-of-00002.safetensors 1000\nmodel-00002-of-00002.safetensors 2000\nconfig.json 12\n")
index = json.dumps({"metadata": {"total_size": 400}, "weight_map": {"a.w": "model-00001-of-00002.safetensors", "b.w": "model-00002-of-00002.safetensors"}})
put("host_df", "rank-files-and-snapshot", f"1000 rank0of2-0123456789abcdef0123.bin\n2000 rank1of2-0123456789abcdef0123.bin\n\0{index}\n@@FILES@@\nconfig.json\nmodel-00001-of-00002.safetensors\n")
put("host_exports", "exports", "/data/hf\n/data 192.168.100.0/24(ro,no_subtree_check) 10.0.0.2(rw)\n# comment\n\"/srv/x\" *(ro)\n/data/hf \\\n  192.168.100.2(ro)\n")
put("host_exports", "rw-only", "/data/hf/hub\n/data/hf 192.168.100.2(rw,sync)\n")
for f in ("nvidia-smi-q-clock.txt", "nvidia-smi-q-performance.txt", "nvidia-smi.txt"):
    put("host_smi", "h200x2-" + f, (facts / f).read_text())
put("host_smi", "two-nodes", (facts / "nvidia-smi-q-clock.txt").read_text() + "\0" + "GPU 0000000F:01:00.0\n    Max Clocks\n        Graphics                          : N/A\n        SM                                : 3003 MHz\n    Locked Clocks\n        Min                               : 2000 MHz\n        Max                               : 2000 MHz\n")
sysfs = "\n".join([
    "10.0.0.2 dev enp1s0f0np0 src 10.0.0.1 uid 0 \\    cache",
    "D\t/sys/class/infiniband\trocep1s0f0 roceP2p1s0f0 ",
    "F\t/sys/class/net/enp1s0f0np0/mtu\t9000",
    "D\t/sys/class/net/enp1s0f0np0/device/infiniband\trocep1s0f0 ",
    "F\t/sys/class/infiniband/rocep1s0f0/ports/1/state\t4: ACTIVE",
    "D\t/sys/class/infiniband/rocep1s0f0/ports/1/gids\t0 1 2 3 ",
    "D\t/sys/class/infiniband/rocep1s0f0/ports/1/gid_attrs/types\t0 1 2 3 ",
    "F\t/sys/class/infiniband/rocep1s0f0/ports/1/gids/3\t0000:0000:0000:0000:0000:ffff:0a00:0001",
    "F\t/sys/class/infiniband/rocep1s0f0/ports/1/gid_attrs/types/3\tRoCE v2",
    "F\t/sys/class/infiniband/roceP2p1s0f0/ports/1/state\t4: ACTIVE",
    "F\t/sys/class/infiniband/roceP2p1s0f0/ports/1/gids/3\t0000:0000:0000:0000:0000:ffff:0a00:0001",
    "F\t/sys/class/infiniband/roceP2p1s0f0/ports/1/gid_attrs/types/3\tRoCE v2",
    "D\t/sys/class/infiniband/roceP2p1s0f0/ports/1/gids\t3 ",
    "",
])
put("host_sysfs", "twins", sysfs)
put("host_sysfs", "no-device", "10.0.0.2 dev eth0 src 10.0.0.1\nF\t/sys/class/net/eth0/mtu\t1500\n")

# hub_json: a tree listing page, a repo info, a manifest, an ETag.
put("hub_json", "tree", json.dumps([
    {"type": "file", "oid": "a" * 40, "size": 1234, "path": "config.json"},
    {"type": "file", "oid": "b" * 40, "size": 5000000000, "path": "model-00001-of-00002.safetensors",
     "lfs": {"oid": "c" * 64, "size": 5000000000, "pointerSize": 134}},
    {"type": "directory", "oid": "d" * 40, "path": "kit"},
    {"type": "file", "oid": "e" * 40, "size": 10, "path": "kit/rope.json"},
]))
put("hub_json", "model-info", json.dumps({"_id": "x", "id": "owner/name", "modelId": "owner/name", "sha": "0123456789abcdef0123456789abcdef01234567", "private": False, "gated": False, "disabled": False, "siblings": [{"rfilename": "config.json"}]}))
put("hub_json", "manifest", json.dumps([{"path": "config.json", "etag": "a" * 40, "expected": {"size": 12, "sha256": None, "git_sha1": "a" * 40}}]))
put("hub_json", "etag", 'W/"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"')
