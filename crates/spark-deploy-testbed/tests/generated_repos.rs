//! The generated original-model repo and kit, and the core's bias_vl / kit / token-map builders on
//! them.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use spark_deploy_core::engine::tensorfold::inputs::{bias_vl, kit, token_map};
use spark_deploy_testbed::checkpoint::{CheckpointSpec, GeneratedRepos, generate};

fn header(path: &Path) -> (usize, BTreeMap<String, Value>, Vec<u8>) {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let text = b[8..8 + n].to_vec();
    (8 + n, serde_json::from_slice(&text).unwrap(), b)
}

fn small_repos(seed: u64) -> (tempfile::TempDir, GeneratedRepos) {
    let d = tempfile::tempdir().unwrap();
    let g = generate(&CheckpointSpec::small(seed), d.path()).unwrap();
    (d, g)
}

#[test]
fn engram_tables_and_bias_vl_are_where_the_engine_looks() {
    let (_d, g) = small_repos(21);
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(g.model_dir.join("config.json")).unwrap()).unwrap();
    let t = &cfg["text_config"];
    let layers: Vec<u64> = t["engram_layer_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let rows: Vec<u64> = t["engram_num_embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    // the engine opens every *.safetensors in the directory and keeps *engram.embed.{weight,scale}
    let mut found: BTreeMap<String, (String, Vec<u64>)> = BTreeMap::new();
    let mut bias_vl_count = 0;
    for e in std::fs::read_dir(&g.original_dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("safetensors") {
            continue;
        }
        for (name, v) in header(&p).1 {
            if name.ends_with("engram.embed.weight") || name.ends_with("engram.embed.scale") {
                let shape = v["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect();
                found.insert(
                    name.clone(),
                    (v["dtype"].as_str().unwrap().to_owned(), shape),
                );
            }
            if name.ends_with(".ffn.gate.bias_vl") {
                bias_vl_count += 1;
                assert_eq!(v["dtype"], "F32");
            }
        }
    }
    for (l, r) in layers.iter().zip(&rows) {
        let w = &found[&format!("layers.{l}.engram.embed.weight")];
        let s = &found[&format!("layers.{l}.engram.embed.scale")];
        assert_eq!(w.0, "F8_E4M3");
        assert_eq!(s.0, "F8_E8M0");
        assert_eq!(w.1[0], *r);
        assert_eq!(s.1[0], *r, "both halves have the config's row count");
    }
    let blocks =
        t["num_hidden_layers"].as_u64().unwrap() + t["num_nextn_predict_layers"].as_u64().unwrap();
    assert_eq!(bias_vl_count, blocks);
    // the EXL3 export carries none of them
    for e in std::fs::read_dir(&g.model_dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) == Some("safetensors") {
            assert!(
                !header(&p)
                    .1
                    .keys()
                    .any(|k| k.contains("engram.embed") || k.ends_with("bias_vl"))
            );
        }
    }
}

#[test]
fn bias_vl_file_copies_the_tensors_byte_for_byte() {
    let (d, g) = small_repos(22);
    let out = d.path().join("gate_bias_vl.safetensors");
    let r = bias_vl::write_bias_vl(&g.original_dir, &out).unwrap();
    let (start, h, bytes) = header(&out);
    // make_bias_vl.py's layout: json.dumps spacing, sorted names, __metadata__ last
    let text = std::str::from_utf8(&bytes[8..start]).unwrap().trim_end();
    assert!(
        text.starts_with("{\"layers.0.ffn.gate.bias_vl\": {\"dtype\": \"F32\", \"shape\": ["),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "\"__metadata__\": {{\"source\": \"{}\"}}}}",
            bias_vl::SOURCE_NOTE
        )),
        "{text}"
    );
    assert_eq!(start % 8, 0);
    let idx: Value = serde_json::from_slice(
        &std::fs::read(g.original_dir.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let mut n = 0;
    for (name, v) in &h {
        if name == "__metadata__" {
            continue;
        }
        let o = v["data_offsets"].as_array().unwrap();
        let got = &bytes
            [start + o[0].as_u64().unwrap() as usize..start + o[1].as_u64().unwrap() as usize];
        let shard = idx["weight_map"][name].as_str().unwrap();
        let (s_start, s_h, s_bytes) = header(&g.original_dir.join(shard));
        let so = s_h[name]["data_offsets"].as_array().unwrap();
        assert_eq!(
            got,
            &s_bytes[s_start + so[0].as_u64().unwrap() as usize
                ..s_start + so[1].as_u64().unwrap() as usize],
            "{name}"
        );
        n += 1;
    }
    assert_eq!(n, r.tensors);
    // the kit's copy is the same file, and the kit's MANIFEST vouches for it
    assert!(kit::check_file(&g.kit_dir, "vision/gate_bias_vl.safetensors").unwrap());
    assert_eq!(
        std::fs::read(g.kit_dir.join("vision/gate_bias_vl.safetensors")).unwrap(),
        bytes
    );
}

#[test]
fn kit_verifies_and_a_changed_file_is_caught() {
    let (_d, g) = small_repos(23);
    let n = kit::verify_kit(&g.kit_dir).unwrap();
    assert!(n >= 12, "{n}");
    let p = g.kit_dir.join("rope-plain-sin.f32");
    let mut b = std::fs::read(&p).unwrap();
    b[100] ^= 1;
    std::fs::write(&p, b).unwrap();
    let e = kit::verify_kit(&g.kit_dir).unwrap_err();
    assert!(e.to_string().contains("DIFFERS rope-plain-sin.f32"), "{e}");
}

#[test]
fn token_map_count_check_refuses_a_different_config() {
    let (d, g) = small_repos(24);
    let out = d.path().join("map.json");
    let m = token_map::write_token_map(&g.model_dir, &out).unwrap();
    assert_eq!(m.compressed, g.compressed_vocab);
    assert_eq!(m.ids.len(), g.tokens);
    std::fs::remove_file(&out).unwrap();
    let cfg_path = g.model_dir.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["text_config"]["engram_compressed_vocab_size"] = (g.compressed_vocab + 1).into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let e = token_map::write_token_map(&g.model_dir, &out).unwrap_err();
    assert!(matches!(e, token_map::TokenMapError::Count { .. }), "{e}");
    assert!(!out.exists());
}
