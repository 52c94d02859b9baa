use super::host::{below_floor, tool};
use super::*;
use crate::config::NodeConfig;

#[test]
fn only_a_readable_value_below_the_floor_is_waited_for() {
    let m = Ok("MemAvailable: 1048576 kB\n".to_owned());
    assert_eq!(below_floor(&m, 2 << 30), Some(1 << 30));
    assert_eq!(below_floor(&m, 1 << 30), None);
    assert_eq!(below_floor(&Err("x".into()), 2 << 30), None);
    assert_eq!(below_floor(&Ok("MemTotal: 5 kB".into()), 2 << 30), None);
    // A floor above the machine's memory is never reached: no wait, the check fails at once.
    let small = Ok("MemTotal: 2097152 kB\nMemAvailable: 1048576 kB\n".to_owned());
    assert_eq!(below_floor(&small, 1 << 30), None);
    assert_eq!(below_floor(&small, 2 << 30), Some(1 << 30));
    assert_eq!(below_floor(&small, 3 << 30), None);
}

#[tokio::test]
async fn a_nodes_path_is_searched_first_for_its_tools() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let bin = t.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("nvidia-smi");
    std::fs::write(&script, "#!/bin/sh\necho \"found: $*\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exec = Exec::local("head");
    let mut node = NodeConfig::head();
    node.path = vec![bin.display().to_string()];
    let out = text(&exec, &tool(&node, "nvidia-smi", &["-q", "-d", "CLOCK"])).await;
    assert_eq!(out.as_deref(), Ok("found: -q -d CLOCK\n"));
    // The default PATH still serves everything else.
    let out = text(&exec, &tool(&node, "echo", &["a b"])).await;
    assert_eq!(out.as_deref(), Ok("a b\n"));
    // Without `path` the program is run as is.
    node.path.clear();
    assert!(text(&exec, &tool(&node, "true", &[])).await.is_ok());
}
