//! `--speculative draft:MODEL` end to end on the `tiny` synthetic model:
//! drafting for itself gives plain decoding's tokens, and a draft model
//! that is missing, of another vocabulary or larger than the target is
//! refused at start with one line naming the flag and both values.

mod support;

use std::path::{Path, PathBuf};

use support::{clear_error, generate, ok, synth_tiny};

/// `tiny` with `config.json`'s `key` set to `value`, in `dir/name`.
fn tiny_with(dir: &Path, name: &str, key: &str, value: u64) -> PathBuf {
    let out = synth_tiny(dir, name);
    let path = out.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg[key] = value.into();
    std::fs::write(&path, cfg.to_string()).unwrap();
    out
}

fn tokens(o: &std::process::Output) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(ok(o).trim()).expect("one JSON object");
    v["tokens"].clone()
}

#[test]
fn a_draft_model_gives_the_plain_tokens_and_a_bad_one_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let target = synth_tiny(tmp.path(), "target");
    let t = target.to_str().unwrap();
    let args = [
        "--json",
        "--max-tokens",
        "24",
        "--ignore-eos",
        "--prompt-tokens",
        "5,6,7,5,6,7",
    ];
    let mut greedy = args.to_vec();
    greedy.extend(["--temperature", "0"]);
    let plain = tokens(&generate(None, t, &greedy, None));
    let draft_flag = format!("draft:{t}");
    let mut spec = greedy.clone();
    spec.extend(["--speculative", &draft_flag]);
    assert_eq!(tokens(&generate(None, t, &spec, None)), plain);

    let missing = tmp.path().join("nothing-here");
    let flag = format!("draft:{}", missing.display());
    let o = generate(None, t, &["--speculative", &flag, "x"], None);
    clear_error(&o, &["--speculative draft:"]);

    let wide = tiny_with(tmp.path(), "wide", "vocab_size", 320);
    let flag = format!("draft:{}", wide.display());
    let o = generate(None, t, &["--speculative", &flag, "x"], None);
    clear_error(
        &o,
        &["--speculative draft:", "320 tokens", "the target's 300"],
    );

    let deep = tiny_with(tmp.path(), "deep", "num_hidden_layers", 5);
    let flag = format!("draft:{}", deep.display());
    let o = generate(None, t, &["--speculative", &flag, "x"], None);
    clear_error(
        &o,
        &["--speculative draft:", "larger than the target", "5 layers"],
    );
}
