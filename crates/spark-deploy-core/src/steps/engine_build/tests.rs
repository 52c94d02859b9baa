use super::*;

fn recipe() -> BuildRecipe {
    crate::engine::tensorfold::build_recipe(crate::engine::tensorfold::Branch::Tp2)
}

#[test]
fn the_key_follows_commit_patches_base_and_command() {
    let p = vec![("0001-a.patch".to_owned(), "aa".to_owned())];
    let k = cache_key("c1", &p, "sha256:b1", &recipe());
    assert_eq!(k, cache_key("c1", &p, "sha256:b1", &recipe()));
    assert_eq!(k.len(), 64);
    assert_ne!(k, cache_key("c2", &p, "sha256:b1", &recipe()));
    assert_ne!(k, cache_key("c1", &[], "sha256:b1", &recipe()));
    assert_ne!(k, cache_key("c1", &p, "sha256:b2", &recipe()));
    let changed = vec![("0001-a.patch".to_owned(), "ab".to_owned())];
    assert_ne!(k, cache_key("c1", &changed, "sha256:b1", &recipe()));
    let renamed = vec![("0001-b.patch".to_owned(), "aa".to_owned())];
    assert_ne!(k, cache_key("c1", &renamed, "sha256:b1", &recipe()));
    let two = vec![
        ("a".to_owned(), "1".to_owned()),
        ("b".to_owned(), "2".to_owned()),
    ];
    let swapped = vec![
        ("b".to_owned(), "2".to_owned()),
        ("a".to_owned(), "1".to_owned()),
    ];
    assert_ne!(
        cache_key("c1", &two, "sha256:b1", &recipe()),
        cache_key("c1", &swapped, "sha256:b1", &recipe()),
        "the order of the patches counts"
    );
    let mut other = recipe();
    other.command.push("-Dextra=1".into());
    assert_ne!(k, cache_key("c1", &p, "sha256:b1", &other));
    let mut split = recipe();
    // The argv's boundaries count, not just its text.
    split.command = vec!["zig build".into()];
    let mut joined = recipe();
    joined.command = vec!["zig".into(), "build".into()];
    assert_ne!(
        cache_key("c1", &p, "sha256:b1", &split),
        cache_key("c1", &p, "sha256:b1", &joined)
    );
}

const PATCH: &str = "\
diff --git a/src/main.c b/src/main.c
index 1111111..2222222 100644
--- a/src/main.c
+++ b/src/main.c
@@ -1,3 +1,3 @@
 #include <stdio.h>
-#define A 1
+#define A 2
 int x;
@@ -10,3 +10,3 @@ int main(void)
 {
-  return A;
+  return A + 1;
 }
diff --git a/README b/README
--- a/README
+++ b/README
@@ -10,1 +10,1 @@
-old
+new
";

#[test]
fn a_failed_hunk_is_located_in_the_patch() {
    let stderr = "error: patch failed: src/main.c:10\nerror: src/main.c: patch does not apply\n";
    let f = parse_apply_error(stderr, PATCH);
    assert_eq!(f.file.as_deref(), Some("src/main.c"));
    assert_eq!(f.line, Some(10));
    assert_eq!(f.hunk, Some((2, 10)));
    let text = f.to_string();
    assert!(
        text.contains("hunk #2 for src/main.c (line 10 of the patch)")
            && text.contains("at line 10")
            && text.contains("patch does not apply"),
        "{text}"
    );
    // The same start line in another file's hunks is not confused with it.
    let f = parse_apply_error("error: patch failed: README:10\n", PATCH);
    assert_eq!(f.hunk, Some((1, 18)));
}

#[test]
fn other_apply_errors_name_the_file_or_keep_gits_words() {
    let f = parse_apply_error("error: src/gone.c: No such file or directory\n", PATCH);
    assert_eq!(f.file.as_deref(), Some("src/gone.c"));
    assert_eq!(f.line, None);
    assert!(f.to_string().contains("No such file or directory"), "{f}");
    let f = parse_apply_error("error: corrupt patch at line 7\n", "x");
    assert_eq!(f.file, None);
    assert_eq!(f.to_string(), "git: error: corrupt patch at line 7");
    let f = parse_apply_error(
        "error: patch failed: src/main.c:99\nerror: src/main.c: patch does not apply\n",
        PATCH,
    );
    assert_eq!((f.line, f.hunk), (Some(99), None));
    assert!(
        f.to_string()
            .starts_with("the hunk for src/main.c at line 99"),
        "{f}"
    );
}
