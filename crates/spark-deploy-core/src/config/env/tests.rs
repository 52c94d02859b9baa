use super::*;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let v: Vec<(String, String)> = pairs
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    move |k| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone())
}

#[test]
fn recipe_names_set_fields() {
    let mut c = DeploymentConfig::default();
    let applied = apply_env(
        &mut c,
        &env(&[
            ("WORKER", "ops@10.0.0.2"),
            ("FABRIC_PEER", "192.0.2.2"),
            ("CONTEXT", "524288"),
            ("NFS_VOLUME", ""),
            ("PREPARE", "0"),
            ("TF_DS_IDX_SPLIT", "3"),
            ("HF_TOKEN", "hf_x"),
        ]),
    )
    .unwrap();
    assert_eq!(applied.len(), 7);
    assert_eq!(c.nodes[1].ssh, "ops@10.0.0.2");
    assert_eq!(c.nodes[1].fabric_addr, Some(Ipv4Addr::new(192, 0, 2, 2)));
    assert_eq!(c.serving.context, 524_288);
    assert_eq!(c.deployment.worker_storage, WorkerStorage::Copy);
    assert_eq!(c.lifecycle.prepare, PreparePolicy::Never);
    assert_eq!(c.engine.switches["TF_DS_IDX_SPLIT"], "3");
    assert_eq!(c.hub.token.as_ref().unwrap().expose(), "hf_x");
}

#[test]
fn nfs_volume_selects_copy_local_tree_or_a_volume_as_in_the_recipe() {
    let mode = |v: &str| {
        let mut c = DeploymentConfig::default();
        apply_env(&mut c, &env(&[("NFS_VOLUME", v)])).unwrap();
        (
            c.deployment.worker_storage,
            c.storage.nfs_volume.clone(),
            c.storage.worker_tree.clone(),
        )
    };
    let default_volume = DeploymentConfig::default().storage.nfs_volume;
    assert_eq!(mode("").0, WorkerStorage::Copy);
    assert_eq!(
        mode("/srv/hf"),
        (WorkerStorage::Local, default_volume, "/srv/hf".to_owned())
    );
    assert_eq!(
        mode("dsv41-hf"),
        (WorkerStorage::Nfs, "dsv41-hf".to_owned(), String::new())
    );
    // Validated: local mode names its tree; a path given as a volume name is refused with
    // the way to local mode.
    let mut c = DeploymentConfig::default();
    apply_env(&mut c, &env(&[("NFS_VOLUME", "/srv/hf")])).unwrap();
    crate::config::validate(c, std::path::Path::new("/home/u")).unwrap();
    let mut c = DeploymentConfig::default();
    c.deployment.worker_storage = WorkerStorage::Local;
    let e = crate::config::validate(c, std::path::Path::new("/home/u"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("storage.worker_tree"), "{e}");
    let mut c = DeploymentConfig::default();
    c.storage.nfs_volume = "/srv/hf".into();
    let e = crate::config::validate(c, std::path::Path::new("/home/u"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("storage.nfs_volume") && e.contains("\"local\""),
        "{e}"
    );
}

/// (value the file gives, environment, expected result).
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// The head's cache root, token file and token after the environment and validation, with
/// the file setting `hub.cache` / `hub.token_file` when given.
fn hf(file: (&str, &str), pairs: &[(&str, &str)]) -> (String, String, Option<String>) {
    let mut c = DeploymentConfig::default();
    (c.hub.cache, c.hub.token_file) = (file.0.to_owned(), file.1.to_owned());
    apply_env(&mut c, &env(pairs)).unwrap();
    let v = crate::config::validate(c, std::path::Path::new("/home/u")).unwrap();
    let h = &v.config().hub;
    (
        h.cache.clone(),
        h.token_file.clone(),
        h.token.as_ref().map(|t| t.expose().to_owned()),
    )
}

#[test]
fn hf_cache_precedence_is_huggingface_hubs() {
    // (file's hub.cache, environment) -> cache root; huggingface_hub's hub cache is <root>/hub.
    let cases: &[Case] = &[
        ("", &[], "/home/u/.cache/huggingface"),
        ("", &[("XDG_CACHE_HOME", "/x")], "/x/huggingface"),
        ("", &[("XDG_CACHE_HOME", "/x"), ("HF_HOME", "/h")], "/h"),
        (
            "",
            &[("HF_HOME", "/h"), ("HUGGINGFACE_HUB_CACHE", "/old/hub")],
            "/old",
        ),
        (
            "",
            &[
                ("HUGGINGFACE_HUB_CACHE", "/old/hub"),
                ("HF_HUB_CACHE", "/new/hub/"),
            ],
            "/new",
        ),
        ("", &[("HF_HOME", "~/h")], "/home/u/h"),
        (
            "",
            &[("HF_HOME", "$XDG_CACHE_HOME/h"), ("XDG_CACHE_HOME", "/x")],
            "/x/h",
        ),
        // The recipe's HF_CACHE ranks above HF_HOME (as in the recipe), below HF_HUB_CACHE.
        ("", &[("HF_HOME", "/h"), ("HF_CACHE", "/r")], "/r"),
        ("", &[("HF_CACHE", "/r"), ("HF_HUB_CACHE", "/n/hub")], "/n"),
        // The environment wins over the file, except XDG_CACHE_HOME, which moves a default only.
        ("/f", &[("XDG_CACHE_HOME", "/x")], "/f"),
        ("/f", &[("HF_HOME", "/h")], "/h"),
        ("/f", &[("HF_HUB_CACHE", "/n/hub")], "/n"),
        // Empty variables count as unset.
        ("/f", &[("HF_HOME", ""), ("HF_HUB_CACHE", " ")], "/f"),
    ];
    for (file, pairs, want) in cases {
        assert_eq!(
            hf((file, ""), pairs).0,
            *want,
            "file {file:?}, env {pairs:?}"
        );
    }
}

#[test]
fn hf_token_precedence_is_huggingface_hubs() {
    // (file's hub.token_file, environment) -> token file.
    let cases: &[Case] = &[
        ("", &[], "/home/u/.cache/huggingface/token"),
        ("", &[("XDG_CACHE_HOME", "/x")], "/x/huggingface/token"),
        ("", &[("HF_HOME", "/h")], "/h/token"),
        (
            "",
            &[("HF_HOME", "/h"), ("HF_TOKEN_PATH", "/t/tok")],
            "/t/tok",
        ),
        // The token stays where `hf auth login` wrote it when only the hub cache moves.
        (
            "",
            &[("HF_HUB_CACHE", "/n/hub")],
            "/home/u/.cache/huggingface/token",
        ),
        (
            "",
            &[("HF_CACHE", "/r")],
            "/home/u/.cache/huggingface/token",
        ),
        ("/f/tok", &[("XDG_CACHE_HOME", "/x")], "/f/tok"),
        ("/f/tok", &[("HF_HOME", "/h")], "/h/token"),
    ];
    for (file, pairs, want) in cases {
        assert_eq!(
            hf(("", file), pairs).1,
            *want,
            "file {file:?}, env {pairs:?}"
        );
    }
    // HF_TOKEN wins over the legacy name; either is cleaned like huggingface_hub's.
    let t = |pairs: &[(&str, &str)]| hf(("", ""), pairs).2;
    assert_eq!(t(&[]), None);
    assert_eq!(
        t(&[("HUGGING_FACE_HUB_TOKEN", "hf_old")]).as_deref(),
        Some("hf_old")
    );
    assert_eq!(
        t(&[
            ("HUGGING_FACE_HUB_TOKEN", "hf_old"),
            ("HF_TOKEN", " hf_new\n")
        ])
        .as_deref(),
        Some("hf_new")
    );
    assert_eq!(
        t(&[("HUGGING_FACE_HUB_TOKEN", "hf_old"), ("HF_TOKEN", "")]).as_deref(),
        Some("hf_old")
    );
}

#[test]
fn a_hub_cache_not_named_hub_is_refused_with_the_fix() {
    let mut c = DeploymentConfig::default();
    let e = apply_env(&mut c, &env(&[("HF_HUB_CACHE", "/data/models")])).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("HF_HUB_CACHE")
            && text.contains("hub.cache")
            && text.contains("/data/models/hub"),
        "{text}"
    );
    assert!(e.remedy().unwrap().contains("HF_HUB_CACHE"));
}

#[test]
fn hf_endpoint_and_offline() {
    let mut c = DeploymentConfig::default();
    apply_env(&mut c, &env(&[("HF_ENDPOINT", "http://127.0.0.1:9/")])).unwrap();
    assert_eq!(c.hub.endpoint, "http://127.0.0.1:9");
    let offline = |pairs: &[(&str, &str)]| {
        let mut c = DeploymentConfig::default();
        apply_env(&mut c, &env(pairs)).unwrap();
        c.hub.offline
    };
    assert!(!offline(&[]));
    assert!(offline(&[("HF_HUB_OFFLINE", "1")]));
    assert!(offline(&[("HF_HUB_OFFLINE", "true")]));
    assert!(offline(&[("TRANSFORMERS_OFFLINE", "YES")]));
    // HF_HUB_OFFLINE decides when set, even against TRANSFORMERS_OFFLINE; empty falls through.
    assert!(!offline(&[
        ("TRANSFORMERS_OFFLINE", "1"),
        ("HF_HUB_OFFLINE", "0")
    ]));
    assert!(offline(&[
        ("TRANSFORMERS_OFFLINE", "1"),
        ("HF_HUB_OFFLINE", "")
    ]));
}

#[test]
fn applied_says_which_variable_set_which_key() {
    let mut c = DeploymentConfig::default();
    c.hub.cache = "/f".into();
    let applied = apply_env(
        &mut c,
        &env(&[
            ("XDG_CACHE_HOME", "/x"),
            ("HF_HOME", "/h"),
            ("HF_HUB_CACHE", "/n/hub"),
            ("HF_TOKEN", "hf_secret"),
            ("PORT", "9000"),
        ]),
    )
    .unwrap();
    let row = |var: &str, key: &str| {
        applied
            .iter()
            .find(|a| a.var == var && a.key == key)
            .cloned()
    };
    // XDG_CACHE_HOME moves only the token file's default here: the file names the cache.
    assert_eq!(row("XDG_CACHE_HOME", "hub.cache"), None);
    let xdg = row("XDG_CACHE_HOME", "hub.token_file").unwrap();
    assert_eq!(xdg.shadowed_by, Some("HF_HOME"));
    assert_eq!(
        row("HF_HOME", "hub.cache").unwrap().shadowed_by,
        Some("HF_HUB_CACHE")
    );
    assert_eq!(row("HF_HOME", "hub.token_file").unwrap().shadowed_by, None);
    let hub = row("HF_HUB_CACHE", "hub.cache").unwrap();
    assert_eq!((hub.value.as_str(), hub.shadowed_by), ("/n/hub", None));
    assert_eq!(row("HF_TOKEN", "hub.token").unwrap().value, "***");
    assert_eq!(row("PORT", "serving.port").unwrap().value, "9000");
    assert!(!format!("{applied:?}").contains("hf_secret"));
}

#[test]
fn bad_value_names_the_variable_and_hides_secrets() {
    let mut c = DeploymentConfig::default();
    let e = apply_env(&mut c, &env(&[("CONTEXT", "lots")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("CONTEXT") && e.contains("serving.context") && e.contains("whole number"),
        "{e}"
    );
    assert!(OPAQUE_SWITCHES.iter().all(|s| find(s).is_some()));
}

#[test]
fn endpoint_credentials_are_a_secret_of_the_config() {
    let mut c = DeploymentConfig::default();
    let applied = apply_env(
        &mut c,
        &env(&[("HF_ENDPOINT", "https://bob:pa55word@hub.example/")]),
    )
    .unwrap();
    assert_eq!(c.hub.endpoint, "https://bob:pa55word@hub.example");
    assert_eq!(applied[0].value, "https://***@hub.example/");
    let secrets = c.secrets();
    assert!(secrets.iter().any(|s| s.expose() == "bob:pa55word"));
    let line = "GET https://bob:pa55word@hub.example/api failed";
    let redacted = secrets.iter().fold(line.to_owned(), |t, s| s.redact_in(&t));
    assert_eq!(redacted, "GET https://***@hub.example/api failed");
}
