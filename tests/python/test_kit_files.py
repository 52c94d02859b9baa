"""The kit's generated files against independent tools: the bias_vl file against a standard-library
Python build of the same layout (every `*.ffn.gate.bias_vl` tensor, names sorted, `json.dumps` header with
`__metadata__` last, space padding to 8), and the MANIFEST against coreutils `sha256sum -c`."""
import json
import struct
import subprocess
from pathlib import Path

from conftest import run

NOTE = "deepseek-ai/DeepSeek-V4.1-Flash (MIT): the ffn.gate.bias_vl tensors, byte for byte"


def reference_bias_vl(original: Path) -> bytes:
    weight_map = json.loads((original / "model.safetensors.index.json").read_text())["weight_map"]
    header, blobs, at = {}, [], 0
    for name in sorted(n for n in weight_map if n.endswith(".ffn.gate.bias_vl")):
        raw = (original / weight_map[name]).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        info = json.loads(raw[8:8 + n])[name]
        lo, hi = info["data_offsets"]
        data = raw[8 + n + lo:8 + n + hi]
        header[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    header["__metadata__"] = {"source": NOTE}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def test_bias_vl_matches_a_stdlib_reference(sd_inputs, small_checkpoint, tmp_path):
    out = tmp_path / "gate_bias_vl.safetensors"
    run(sd_inputs, "bias-vl", small_checkpoint["original_dir"], out)
    want = reference_bias_vl(Path(small_checkpoint["original_dir"]))
    assert out.read_bytes() == want
    assert (Path(small_checkpoint["kit_dir"]) / "vision" / "gate_bias_vl.safetensors").read_bytes() == want


def test_manifest_is_sha256sum_format(small_checkpoint):
    kit = Path(small_checkpoint["kit_dir"])
    r = subprocess.run(["sha256sum", "--check", "--strict", "MANIFEST"], cwd=kit, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": OK") == len((kit / "MANIFEST").read_text().splitlines())


def test_verify_kit_reports_a_changed_file(sd_inputs, small_checkpoint, tmp_path):
    import shutil
    kit = tmp_path / "kit"
    shutil.copytree(small_checkpoint["kit_dir"], kit)
    assert "kit OK" in run(sd_inputs, "verify-kit", kit).stdout
    p = kit / "engram.json"
    p.write_text(p.read_text() + " ")
    r = run(sd_inputs, "verify-kit", kit, check=False)
    assert r.returncode != 0 and "DIFFERS engram.json" in r.stderr, r.stderr
