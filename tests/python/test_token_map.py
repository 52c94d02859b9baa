"""The native token map (one compressed id per token id) equals, byte for byte, the reference built with the
Python `tokenizers` package (make_token_map_ref.py), and the count check refuses a tokenizer whose
count differs from config.json."""
import json
import shutil
import sys

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from conftest import HERE, run

REF = HERE / "make_token_map_ref.py"


def both(sd_inputs, model_dir, tmp_path, check=True):
    ours, ref = tmp_path / "ours.json", tmp_path / "ref.json"
    a = run(sd_inputs, "token-map", model_dir, ours, check=check)
    b = run(sys.executable, REF, model_dir, ref, check=check)
    return a, b, ours, ref


@pytest.mark.parametrize("seed", [3, 11])
def test_generated_tokenizer_matches_reference(sd_inputs, tmp_path, seed):
    run(sd_inputs, "generate", "small", seed, tmp_path / "ckpt")
    model = tmp_path / "ckpt" / "model"
    _, _, ours, ref = both(sd_inputs, model, tmp_path)
    assert ours.read_bytes() == ref.read_bytes()
    ids = json.loads(ours.read_text())
    cfg = json.loads((model / "config.json").read_text())["text_config"]
    assert len(set(ids)) == cfg["engram_compressed_vocab_size"]
    assert len(ids) == Tokenizer.from_file(str(model / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


def test_generated_tokenizer_has_every_kind_of_token(small_checkpoint):
    tok = Tokenizer.from_file(small_checkpoint["model_dir"] + "/tokenizer.json")
    n = tok.get_vocab_size(with_added_tokens=True)
    texts = [tok.decode([i], skip_special_tokens=False) for i in range(n)]
    assert any("\ufffd" in t for t in texts), "tokens decoding to U+FFFD"
    assert any(t.strip() == "" and len(t) > 1 for t in texts), "whitespace-only tokens"
    assert " " in texts, "a single-space token"
    assert any(t != t.encode("ascii", "ignore").decode() and "\ufffd" not in t for t in texts), "accented text"
    added = tok.get_added_tokens_decoder()
    assert any(a.special for a in added.values()) and any(not a.special for a in added.values())
    # it is a working tokenizer, not only a vocabulary
    enc = tok.encode("Café naïve ﬁle")
    assert tok.decode(enc.ids) == "Café naïve ﬁle"


def test_count_check_fails_when_counts_differ(sd_inputs, small_checkpoint, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(f"{small_checkpoint['model_dir']}/{f}", model / f)
    tok = json.loads((model / "tokenizer.json").read_text())
    n = Tokenizer.from_file(str(model / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    tok["added_tokens"].append({"id": n, "content": "<|a brand new token|>", "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    (model / "tokenizer.json").write_text(json.dumps(tok))
    a, b, ours, ref = both(sd_inputs, model, tmp_path, check=False)
    assert a.returncode != 0 and "engram_compressed_vocab_size" in a.stderr, a.stderr
    assert b.returncode != 0
    assert not ours.exists(), "nothing is written when the count check fails"


def test_word_level_tokenizer_without_decoder(sd_inputs, tmp_path):
    vocab = {w: i for i, w in enumerate(
        ["[UNK]", "Hello", "hello", "HELLO", "Ésope", "esope", " ", "  ", "\t", "ﬁx", "fix", "Ⅳ", "iv", "\u00a0"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.add_tokens(["Añadido"])
    model = tmp_path / "model"
    model.mkdir()
    tok.save(str(model / "tokenizer.json"))
    # the config's count comes from the reference, without a check
    (model / "config.json").write_text(json.dumps({"text_config": {}}))
    run(sys.executable, REF, model, tmp_path / "probe.json")
    count = len(set(json.loads((tmp_path / "probe.json").read_text())))
    (model / "config.json").write_text(json.dumps({"text_config": {"engram_compressed_vocab_size": count}}))
    _, _, ours, ref = both(sd_inputs, model, tmp_path)
    assert ours.read_bytes() == ref.read_bytes()


def test_byte_level_added_tokens_go_through_the_decoder(sd_inputs, tmp_path):
    from tokenizers import decoders
    # "Ġ" is byte 0x20 in the byte-level alphabet: an added "ĠHello" decodes to " Hello"
    vocab = {"a": 0, "A": 1, "Ã": 2, "©": 3, "Ã©": 4, "Ġ": 5, "ĠĠ": 6}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ã", "©"), ("Ġ", "Ġ")]))
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(["ĠHello", "hello", "<|x y|>"])
    tok.add_special_tokens(["ĠSpecial", "<s>"])
    model = tmp_path / "model"
    model.mkdir()
    tok.save(str(model / "tokenizer.json"))
    (model / "config.json").write_text(json.dumps({"text_config": {}}))
    run(sys.executable, REF, model, tmp_path / "probe.json")
    ids = json.loads((tmp_path / "probe.json").read_text())
    assert ids[7] == ids[8], "' Hello' and 'hello' share a key"
    (model / "config.json").write_text(json.dumps({"engram_compressed_vocab_size": len(set(ids))}))
    _, _, ours, ref = both(sd_inputs, model, tmp_path)
    assert ours.read_bytes() == ref.read_bytes()
