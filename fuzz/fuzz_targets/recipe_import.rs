//! A recipe directory: `.env`, then (after a NUL byte) `scripts/local.sh`, imported with the core's
//! public `import_recipe` (which validates what it imports) and the result validated again.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::config::{recipe::import_recipe, validate};

fn recipe_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // tmpfs when there is one: two small files are written every iteration.
        let shm = std::path::Path::new("/dev/shm");
        let tmp = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let d = tmp.join(format!("sd-fuzz-recipe-{}", std::process::id()));
        std::fs::create_dir_all(d.join("scripts")).expect("a temporary directory");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(2, |b| *b == 0);
    let dir = recipe_dir();
    std::fs::write(dir.join(".env"), parts.next().unwrap_or_default()).expect("write .env");
    match parts.next() {
        Some(local) => std::fs::write(dir.join("scripts/local.sh"), local).expect("write local.sh"),
        None => {
            let _ = std::fs::remove_file(dir.join("scripts/local.sh"));
        }
    }
    match import_recipe(dir, Path::new("/home/fuzz")) {
        Ok(imported) => {
            let _ = (imported.imported.len(), imported.skipped.len());
            if let Err(e) = validate(imported.config, Path::new("/home/fuzz")) {
                let _ = (e.to_string(), e.remedy(), e.field());
            }
        }
        Err(e) => {
            let _ = (e.to_string(), e.remedy(), e.field());
        }
    }
});
