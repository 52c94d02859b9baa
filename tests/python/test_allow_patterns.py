"""spark-deploy selects a repository's files with `huggingface_hub`'s `allow_patterns` rules.

`allow_patterns_table.json` beside this file holds a table of pattern lists and repository paths
and, for each pattern list, the paths `huggingface_hub.utils.filter_repo_objects` keeps. This test
recomputes that answer with the installed `huggingface_hub` and requires it to equal the table;
the core's Rust test `hub::patterns::tests::agrees_with_the_python_table` requires spark-deploy's
matcher (`spark_deploy_core::hub::AllowPatterns`, globset underneath) to give the same answer. So
the two agree on every row, and a `huggingface_hub` that changes its rules fails here.

After editing PATTERNS or PATHS, rewrite the table with
`SPARK_DEPLOY_WRITE_PATTERN_TABLE=1 pytest tests/python/test_allow_patterns.py`, then run the Rust
test.
"""

import json
import os
import pathlib

from huggingface_hub.utils import filter_repo_objects

TABLE = pathlib.Path(__file__).with_name("allow_patterns_table.json")

# Repository paths as the Hub lists them (no leading `/`, `/` between folders).
PATHS = [
    "config.json",
    "a/config.json",
    "a/b/config.json",
    "model-00001-of-00039.safetensors",
    "model-00012-of-00039.safetensors",
    "model.safetensors.index.json",
    "original/model-00001-of-00002.safetensors",
    "vision/gate_bias_vl.safetensors",
    "vision/sub/x.bin",
    "a/x.bin",
    "a/xy.bin",
    "a/.hidden",
    ".gitattributes",
    "README.md",
    "readme.md",
    "tokenizer.json",
    "tokenizer_config.json",
    "kit/bin/tf-dsv41-lanes",
    "a.txt",
    "b.txt",
    "c.txt",
    "-.txt",
    "].txt",
    "!.txt",
    "^.txt",
    "x[1].txt",
    "x1.txt",
    "{a,b}.txt",
    "a,b.txt",
    "a/b",
    "ab",
    ":.txt",
]

# Each entry is one `allow_patterns` list.
PATTERNS = [
    ["*"],
    ["*.json"],
    ["**.json"],
    ["**/*.json"],
    ["*/config.json"],
    ["a/*"],
    ["a/**"],
    ["a/**/config.json"],
    ["a/"],
    ["vision/"],
    ["model-*-of-*.safetensors"],
    ["model-0000?-of-*.safetensors"],
    ["*.safetensors"],
    ["*/*.safetensors"],
    ["a/?.bin"],
    ["a/??.bin"],
    ["a?b"],
    ["?.txt"],
    ["[ab].txt"],
    ["[!ab].txt"],
    ["[a-c].txt"],
    ["[c-a].txt"],
    ["[]a].txt"],
    ["[!]a].txt"],
    ["[a-].txt"],
    ["[-a].txt"],
    ["[!-].txt"],
    ["[^a].txt"],
    ["[!^].txt"],
    ["[!!].txt"],
    ["[!].txt"],
    ["[!x-z]*.txt"],
    ["[*].txt"],
    ["[[]*"],
    ["x[[]1].txt"],
    ["x[1"],
    ["[[:alpha:]].txt"],
    ["{a,b}.txt"],
    ["a,b.txt"],
    ["./config.json"],
    ["./*"],
    [".*"],
    ["*/.*"],
    ["README.md"],
    ["readme.MD"],
    ["tokenizer*"],
    ["*tokenizer*"],
    ["kit/"],
    ["kit/bin/tf-*"],
    [""],
    ["*.json", "tokenizer*"],
    ["config.json", "vision/"],
    ["[0-9]*", "*[0-9].txt"],
]


def compute() -> dict:
    """The table: for each pattern list, the paths `filter_repo_objects` keeps, in PATHS order."""
    return {
        "paths": PATHS,
        "cases": [
            {
                "patterns": patterns,
                "selected": list(filter_repo_objects(PATHS, allow_patterns=patterns)),
            }
            for patterns in PATTERNS
        ],
    }


def test_the_table_is_what_huggingface_hub_selects():
    want = compute()
    if os.environ.get("SPARK_DEPLOY_WRITE_PATTERN_TABLE") == "1":
        TABLE.write_text(json.dumps(want, indent=1) + "\n")
    have = json.loads(TABLE.read_text())
    assert have["paths"] == want["paths"]
    assert len(have["cases"]) == len(want["cases"]) >= 25
    for h, w in zip(have["cases"], want["cases"]):
        assert h == w, f"allow_patterns={w['patterns']}: table {h['selected']}, huggingface_hub {w['selected']}"
    # The table covers what it claims to: `*` crossing folders, a folder pattern, a set, and
    # patterns that select nothing and everything.
    by = {tuple(c["patterns"]): c["selected"] for c in want["cases"]}
    assert "a/b/config.json" in by[("*.json",)]
    assert by[("a/",)] == ["a/config.json", "a/b/config.json", "a/x.bin", "a/xy.bin", "a/.hidden", "a/b"]
    assert by[("[!ab].txt",)] == ["c.txt", "-.txt", "].txt", "!.txt", "^.txt", ":.txt"]
    assert by[("./config.json",)] == [] and by[("*",)] == PATHS
