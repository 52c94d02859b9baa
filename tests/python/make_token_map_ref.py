"""Reference token map (docs/engine-contract.md, "What each rank reads"), written with the Python
`tokenizers` package: python make_token_map_ref.py MODEL_DIR OUT_JSON.

For every token id in order: decode([id], skip_special_tokens=False); a text holding U+FFFD keys by
the token's own string, any other by its normalised text (NFKC, NFD, strip accents, lowercase,
whitespace runs to one space, a lone space kept, stripped), or the raw text when that is empty.
Compressed ids number the keys in order of first appearance. Exits 1 when their count differs from
config.json's engram_compressed_vocab_size (under text_config when present).
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, normalizers

# a private-use character stands in for a lone space while Strip runs
SENTINEL = "\ue000"


def normaliser():
    return normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), SENTINEL),
        normalizers.Strip(),
        normalizers.Replace(SENTINEL, " "),
    ])


def token_map(tokenizer_json):
    tok = Tokenizer.from_file(str(tokenizer_json))
    norm = normaliser()
    keys = {}
    out = []
    for tid in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([tid], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(tid)
        else:
            key = norm.normalize_str(text) or text
        out.append(keys.setdefault(key, len(keys)))
    return out, len(keys)


def main():
    model, out = sys.argv[1:3]
    cfg = json.load(open(os.path.join(model, "config.json")))
    cfg = cfg.get("text_config", cfg)
    ids, n = token_map(os.path.join(model, "tokenizer.json"))
    want = cfg.get("engram_compressed_vocab_size")
    if want is not None and n != want:
        sys.exit(f"compressed ids {n} != the config's {want}")
    with open(out, "w") as f:
        f.write(json.dumps(ids))


if __name__ == "__main__":
    main()
