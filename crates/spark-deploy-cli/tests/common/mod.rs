//! Running the real `spark-deploy` binary with a controlled environment.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs the binary in `cwd` with only HOME, PATH and `env` set.
pub fn run(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spark-deploy"));
    cmd.current_dir(cwd)
        .env_clear()
        .env("HOME", "/home/spark")
        .env("PATH", "/usr/bin:/bin")
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("spark-deploy runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// `plan --json` parsed.
pub fn plan_json(cwd: &Path, env: &[(&str, &str)]) -> serde_json::Value {
    let o = run(cwd, &["plan", "--json"], env);
    assert!(o.status.success(), "plan failed: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}
