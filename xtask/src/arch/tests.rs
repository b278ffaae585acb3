use super::*;
use serde_json::json;

/// A `cargo metadata`-shaped document over `edges` (`from`, `to`, kind:
/// `None` for normal, `Some("dev")`, `Some("build")`).
fn metadata(edges: &[(&str, &str, Option<&str>)]) -> Value {
    let mut names: Vec<&str> = edges.iter().flat_map(|(a, b, _)| [*a, *b]).collect();
    names.sort_unstable();
    names.dedup();
    let id = |n: &str| format!("path+file:///ws/{n}#0.1.0");
    let packages: Vec<Value> = names
        .iter()
        .map(|n| json!({"id": id(n), "name": n}))
        .collect();
    let nodes: Vec<Value> = names
        .iter()
        .map(|n| {
            let deps: Vec<Value> = edges
                .iter()
                .filter(|(a, _, _)| a == n)
                .map(|(_, b, k)| {
                    json!({"name": b.replace('-', "_"), "pkg": id(b),
                           "dep_kinds": [{"kind": k, "target": null}]})
                })
                .collect();
            json!({"id": id(n), "deps": deps})
        })
        .collect();
    json!({"packages": packages, "resolve": {"nodes": nodes, "root": null}})
}

/// The layering of ARCHITECTURE.md, which passes.
const GOOD: [(&str, &str, Option<&str>); 18] = [
    ("cli", "server", None),
    ("cli", "runtime", None),
    ("runtime", "engine", None),
    ("runtime", "model", None),
    ("runtime", "checkpoint", None),
    ("cli", "model", None),
    ("cli", "checkpoint", None),
    ("server", "engine", None),
    ("server", "contract", None),
    ("engine", "paged-kv", None),
    ("engine", "contract", None),
    ("engine", "tokenizer", None),
    ("model", "kernels", None),
    ("model", "gpu", None),
    ("model", "contract", None),
    ("kernels", "gpu", None),
    ("gpu", "cudarc", None),
    ("checkpoint", "ureq", None),
];

fn with(extra: &[(&'static str, &'static str, Option<&'static str>)]) -> Value {
    let mut edges = GOOD.to_vec();
    edges.extend_from_slice(extra);
    metadata(&edges)
}

fn deps(meta: &Value) -> Vec<String> {
    check_deps(meta)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn the_intended_layering_passes() {
    assert_eq!(deps(&with(&[])), Vec::<String>::new());
}

#[test]
fn a_transitive_cuda_edge_is_named_with_its_path() {
    let v = deps(&with(&[("engine", "model", None)]));
    assert!(
        v.iter()
            .any(|v| v.starts_with("engine -> model -> gpu -> cudarc:"))
    );
    assert!(v.iter().any(|v| v.starts_with("engine -> model:")));
    // server reaches it through engine
    assert!(
        v.iter()
            .any(|v| v.starts_with("server -> engine -> model -> kernels:"))
    );
}

#[test]
fn contract_and_paged_kv_stay_cuda_free() {
    let v = deps(&with(&[("contract", "gpu", None)]));
    assert!(v.iter().any(|v| v.starts_with("contract -> gpu:")));
    let v = deps(&with(&[("paged-kv", "kernels", None)]));
    assert!(
        v.iter()
            .any(|v| v.starts_with("paged-kv -> kernels -> gpu -> cudarc:"))
    );
}

#[test]
fn engine_and_server_never_reach_checkpoint_or_its_downloads() {
    let v = deps(&with(&[("engine", "checkpoint", None)]));
    assert!(v.iter().any(|v| v.starts_with("engine -> checkpoint:")));
    assert!(
        v.iter()
            .any(|v| v.starts_with("engine -> checkpoint -> ureq:"))
    );
    let v = deps(&with(&[("server", "zip", None)]));
    assert!(v.iter().any(|v| v.starts_with("server -> zip:")));
}

#[test]
fn nothing_depends_on_cli_and_only_gpu_on_cudarc() {
    let v = deps(&with(&[("server", "cli", None)]));
    assert!(v.iter().any(|v| v.starts_with("server -> cli:")));
    let v = deps(&with(&[("kernels", "cudarc", None)]));
    assert_eq!(
        v,
        ["kernels -> cudarc: only gpu may depend on cudarc directly"]
    );
}

#[test]
fn the_runtime_sits_below_cli_and_beside_server() {
    let v = deps(&with(&[("runtime", "server", None)]));
    assert_eq!(
        v,
        [
            "runtime -> server: runtime must not depend on server (the runtime starts engines; serving them is the server's, beside it)"
        ]
    );
    let v = deps(&with(&[("server", "runtime", None)]));
    assert!(
        v.iter()
            .any(|v| v.starts_with("server -> runtime: server must not depend on runtime"))
    );
    // (and through runtime, on the CUDA and checkpoint crates)
    assert!(
        v.iter()
            .any(|v| v.starts_with("server -> runtime -> model:"))
    );
    let v = deps(&with(&[("checkpoint", "runtime", None)]));
    assert!(v.iter().any(|v| v.starts_with("checkpoint -> runtime:")));
    let v = deps(&with(&[("runtime", "cli", None)]));
    assert!(v.iter().any(|v| v.starts_with("runtime -> cli:")));
}

#[test]
fn dev_and_build_edges_are_not_dependencies() {
    let v = deps(&with(&[
        ("engine", "model", Some("dev")),
        ("contract", "gpu", Some("build")),
    ]));
    assert_eq!(v, Vec::<String>::new());
}

#[test]
fn malformed_metadata_is_an_error() {
    assert!(check_deps(&json!({"packages": []})).is_err());
    assert!(check_deps(&json!({})).is_err());
}

fn unsafe_report(src: &str) -> Vec<String> {
    check_unsafe_source("f.rs", src)
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn an_unsafe_block_without_safety_fails() {
    let src = "fn f(p: *const u8) -> u8 {\n    let x = 1;\n    unsafe { *p }\n}\n";
    assert_eq!(
        unsafe_report(src),
        ["f.rs:3: unsafe block or impl without a `// SAFETY:` comment right before it"]
    );
}

#[test]
fn safety_on_the_line_or_right_above_passes() {
    let ok = [
        "fn f(p: *const u8) -> u8 {\n    // SAFETY: p is valid.\n    unsafe { *p }\n}\n",
        "fn f(p: *const u8) -> u8 {\n    unsafe { *p } // SAFETY: p is valid.\n}\n",
        "fn f(p: *const u8) -> u8 {\n    // SAFETY: p is valid\n    // for reads.\n    unsafe { *p }\n}\n",
        // the comment sits above the statement, the block on its next line
        "fn f(p: *const u8) -> u8 {\n    // SAFETY: p is valid.\n    let x =\n        unsafe { *p };\n    x\n}\n",
        "/* SAFETY: no state. */\nunsafe impl Send for X {}\n",
        "// SAFETY: no state.\n#[allow(dead_code)]\nunsafe impl Sync for X {}\n",
    ];
    for src in ok {
        assert_eq!(unsafe_report(src), Vec::<String>::new(), "{src}");
    }
}

#[test]
fn safety_separated_by_code_or_a_blank_line_fails() {
    let bad = [
        "// SAFETY: p is valid.\nlet y = 2;\nunsafe { *p };\n",
        "// SAFETY: p is valid.\n\nunsafe { *p };\n",
        "// safety: lower case is not the marker\nunsafe { *p };\n",
        "unsafe impl Send for X {}\n",
        "unsafe extern \"C\" {\n    fn abs(x: i32) -> i32;\n}\n",
    ];
    for src in bad {
        assert_eq!(unsafe_report(src).len(), 1, "{src}");
    }
}

#[test]
fn unsafe_in_comments_strings_and_names_is_ignored() {
    let src = concat!(
        "// unsafe { }\n",
        "/* unsafe { /* nested */ unsafe impl } */\n",
        "let a = \"unsafe { }\";\n",
        "let b = r#\"unsafe { \"# ;\n",
        "let c = '\"'; let d = \"\\\" unsafe {\";\n",
        "fn not_unsafe() {} let unsafe_x = 1;\n",
        "type F = unsafe fn(u8) -> u8;\n",
        "#[unsafe(no_mangle)]\n",
        "fn g<'a>(x: &'a u8) -> &'a u8 { x }\n",
    );
    assert_eq!(unsafe_report(src), Vec::<String>::new());
}

#[test]
fn unsafe_fn_needs_a_safety_doc_section() {
    let bad = "/// Reads.\npub unsafe fn read(p: *const u8) -> u8 {\n    // SAFETY: by contract.\n    unsafe { *p }\n}\n";
    assert_eq!(
        unsafe_report(bad),
        ["f.rs:2: unsafe fn without a `# Safety` section in its doc comment"]
    );
    let good = "/// Reads.\n///\n/// # Safety\n/// `p` is valid.\n#[inline]\npub unsafe fn read(p: *const u8) -> u8 {\n    // SAFETY: by contract.\n    unsafe { *p }\n}\n";
    assert_eq!(unsafe_report(good), Vec::<String>::new());
}

#[test]
fn the_workspace_passes() {
    let root = crate::repo::repo_root();
    let meta = cargo_metadata(&root).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(deps(&meta), Vec::<String>::new());
    let (files, v) = check_unsafe_tree(&root).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(files > 50, "only {files} .rs files found");
    let v: Vec<String> = v.iter().map(ToString::to_string).collect();
    assert_eq!(v, Vec::<String>::new());
    let (crates, v) = layers::check_tree(&root).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(crates > 5, "only {crates} crates checked for layering");
    let v: Vec<String> = v.iter().map(ToString::to_string).collect();
    assert_eq!(v, Vec::<String>::new());
}

/// [`layers::check_crate`] over in-memory files (the first is the crate root).
fn layer_report(files: &[(&str, &str)]) -> Vec<String> {
    let read = |p: &str| {
        files
            .iter()
            .find(|(name, _)| *name == p)
            .map(|(_, text)| text.to_string())
    };
    layers::check_crate(files[0].0, &read)
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_two_module_cycle_fails_naming_its_files_in_order() {
    let v = layer_report(&[
        ("c/src/lib.rs", "mod a;\nmod b;\n"),
        ("c/src/a.rs", "use crate::b::B;\npub struct A;\n"),
        (
            "c/src/b.rs",
            "pub struct B;\n\npub fn f(_: super::a::A) {}\n",
        ),
    ]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("c/src/a.rs -> c/src/b.rs -> c/src/a.rs: "),
        "{}",
        v[0]
    );
    assert!(v[0].contains("c/src/a.rs:1 `crate::b::B`"), "{}", v[0]);
    assert!(v[0].contains("c/src/b.rs:3 `super::a::A`"), "{}", v[0]);
}

#[test]
fn a_layered_crate_passes_and_test_code_comments_and_strings_are_no_edges() {
    let files = [
        (
            "c/src/lib.rs",
            "pub mod a;\npub mod b;\npub mod c;\n\npub use c::C;\n",
        ),
        (
            "c/src/a.rs",
            "//! Used by [`crate::c`].\npub struct A;\nconst S: &str = \"crate::c::C\";\n\
             #[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod inline {\n    use crate::c::C;\n}\n\
             #[cfg(test)]\nfn t() -> Result<(), String> {\n    crate::c::f()\n}\n",
        ),
        ("c/src/a/tests.rs", "use crate::c::C;\n"),
        ("c/src/b.rs", "use super::a::A;\npub struct B(A);\n"),
        ("c/src/c.rs", "pub struct C(crate::b::B, super::a::A);\n"),
    ];
    assert_eq!(layer_report(&files), Vec::<String>::new());
    // the same test code outside `cfg(test)` closes a cycle
    let mut planted = files;
    planted[1].1 = "pub struct A;\nfn f(_: crate::C) {}\n";
    let v = layer_report(&planted);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("c/src/a.rs:2 `crate::C`"), "{}", v[0]);
    assert!(v[0].contains("the knot also holds c/src/b.rs"), "{}", v[0]);
}

#[test]
fn a_module_and_its_parent_may_refer_to_each_other() {
    let v = layer_report(&[
        ("c/src/lib.rs", "mod cuda;\npub fn top() {}\n"),
        (
            "c/src/cuda/mod.rs",
            "mod forward;\nmod lora;\npub struct CudaBackend;\n\
             impl CudaBackend {\n    fn f(&self) { forward::g(self); self::lora::h(); }\n}\n",
        ),
        (
            "c/src/cuda/forward.rs",
            "use super::CudaBackend;\npub fn g(_: &CudaBackend) { crate::top(); }\n",
        ),
        (
            "c/src/cuda/lora.rs",
            "pub fn h() { super::forward::g(&super::CudaBackend); }\n",
        ),
    ]);
    assert_eq!(v, Vec::<String>::new());
}

#[test]
fn a_re_export_or_an_inline_module_hides_no_cycle() {
    let v = layer_report(&[
        ("c/src/lib.rs", "mod cuda;\n"),
        (
            "c/src/cuda/mod.rs",
            "mod pipeline;\nmod verify;\nuse pipeline::OutRow;\n",
        ),
        (
            "c/src/cuda/pipeline.rs",
            "pub type OutRow = usize;\nfn f() { super::verify::fold(); }\n",
        ),
        (
            "c/src/cuda/verify.rs",
            "use super::OutRow;\npub fn fold() {}\n",
        ),
    ]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with(
            "c/src/cuda/pipeline.rs -> c/src/cuda/verify.rs -> c/src/cuda/pipeline.rs: "
        ),
        "{}",
        v[0]
    );
    let inline = "mod a {\n    pub fn f() { crate::b::g() }\n}\n\
                  mod b {\n    pub fn g() { super::a::f() }\n}\n";
    let v = layer_report(&[("c/src/lib.rs", inline)]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("c/src/lib.rs::a -> c/src/lib.rs::b -> c/src/lib.rs::a: "),
        "{}",
        v[0]
    );
}

#[test]
fn a_module_without_a_file_is_reported() {
    let v = layer_report(&[("c/src/lib.rs", "mod gone;\n")]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("c/src/lib.rs:1: module `gone` has no file"),
        "{}",
        v[0]
    );
}
