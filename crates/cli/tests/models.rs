//! The model store from the command line: `lamina pull` of a GGUF file
//! written here from a synthetic model, `list`, `generate --model` on it (by
//! id and by path, token for token the same as the source directory), `rm`;
//! and `--model` values that cannot be used, each named with its fix; an
//! import that keeps its blocks when the source moves, refuses a changed
//! GGUF naming the re-import, and takes a known model's sampling values.

mod support;

use support::{clear_error, generate, ok, run, stderr, synth_tiny};

/// Greedy token ids of `model` for a fixed prompt.
fn greedy(home: &std::path::Path, model: &str) -> (Vec<u64>, String) {
    let out = generate(
        Some(home),
        model,
        &[
            "--prompt-tokens",
            "256,72,105,32",
            "--temperature",
            "0",
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--json",
        ],
        None,
    );
    let v: serde_json::Value = serde_json::from_str(ok(&out).trim()).unwrap();
    let ids = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    (ids, v["text"].as_str().unwrap().to_string())
}

#[test]
fn pull_list_generate_rm_a_gguf_file() {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = synth_tiny(work.path(), "tiny");
    // GGUF carries no llama3 rope scaling: compare against the same model without it
    let cfg_path = src.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["rope_scaling"] = serde_json::Value::Null;
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let gguf = work.path().join("Tiny-Test.gguf");
    support::gguf::write_gguf(&src, &gguf);
    let h = Some(home.path());

    let pulled = run(h, &["pull", gguf.to_str().unwrap()], None);
    let line = ok(&pulled);
    let dir = home.path().join("models/tiny-test");
    assert_eq!(line.trim(), format!("tiny-test\t{}", dir.display()));
    assert!(dir.join("model.safetensors").is_file());

    let list = ok(&run(h, &["list"], None));
    let row = list
        .lines()
        .find(|l| l.starts_with("tiny-test"))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        row.contains("GGUF") && row.contains("Tiny-Test.gguf") && row.contains("KB"),
        "{row}"
    );
    assert!(row.ends_with(&dir.display().to_string()), "{row}");

    let want = greedy(home.path(), src.to_str().unwrap());
    assert_eq!(greedy(home.path(), "tiny-test"), want, "by store id");
    // the path again: the import is reused, not redone
    let again = generate(
        h,
        gguf.to_str().unwrap(),
        &[
            "--prompt-tokens",
            "256,72",
            "--temperature",
            "0",
            "--max-tokens",
            "2",
            "--json",
        ],
        None,
    );
    ok(&again);
    assert!(!stderr(&again).contains("importing"), "{}", stderr(&again));
    assert_eq!(greedy(home.path(), gguf.to_str().unwrap()), want, "by path");

    let rm = run(h, &["rm", "tiny-test"], None);
    ok(&rm);
    assert!(!dir.exists());
    assert!(!ok(&run(h, &["list"], None)).contains("tiny-test"));
    clear_error(
        &run(h, &["rm", "tiny-test"], None),
        &["tiny-test", "not in the store", "lamina list"],
    );
    clear_error(&run(h, &["rm", "../models"], None), &["invalid model id"]);
    clear_error(
        &run(h, &["rm", "org/name"], None),
        &["Hugging Face cache", "huggingface-cli delete-cache"],
    );
}

#[test]
fn model_values_that_cannot_be_used_name_the_fix() {
    let home = tempfile::tempdir().unwrap();
    let h = Some(home.path());
    // a hub repo id is fetched from HF_ENDPOINT (here nothing listens)
    let e = generate(h, "HuggingFaceTB/SmolLM2-135M-Instruct", &["hi"], None);
    clear_error(
        &e,
        &[
            "Hugging Face repo HuggingFaceTB/SmolLM2-135M-Instruct",
            "cannot reach http://127.0.0.1:9",
        ],
    );
    let e = generate(h, "/no/such/model.gguf", &["hi"], None);
    clear_error(&e, &["no model at /no/such/model.gguf", "no such file"]);
    let bad = home.path().join("broken.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00").unwrap();
    let e = generate(h, bad.to_str().unwrap(), &["hi"], None);
    // the import announces itself, then fails with one error line
    let err = stderr(&e);
    assert!(!e.status.success() && !err.contains("panicked"), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains("broken.gguf") && last.contains("truncated"),
        "{err}"
    );
    assert!(
        !home.path().join("models/broken").exists(),
        "no half model left behind"
    );
    let e = generate(h, "no-such-id", &["hi"], None);
    clear_error(&e, &["unknown model `no-such-id`", "lamina list"]);
    let e = run(h, &["pull", "meta-llama/Llama-3.2-3B"], None);
    clear_error(&e, &["meta-llama/Llama-3.2-3B", "cannot reach"]);
    let e = run(h, &["pull", "no-such-id"], None);
    clear_error(&e, &["unknown model `no-such-id`"]);
}

/// The store keeps the GGUF's blocks: the source moved away, the model runs
/// the same and `list` names no missing file; the kept file changed, the
/// model is refused with the re-import command and `list` says so. A GGUF
/// naming itself SmolLM2 135M gets the built-in id's sampling values.
#[test]
fn an_imported_gguf_keeps_its_blocks_and_its_known_sampling() {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = synth_tiny(work.path(), "tiny");
    let cfg_path = src.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["rope_scaling"] = serde_json::Value::Null;
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let gguf = work.path().join("Named.gguf");
    support::gguf::write_gguf_named(&src, &gguf, Some(("SmolLM2", "135M")));
    let h = Some(home.path());
    ok(&run(h, &["pull", gguf.to_str().unwrap()], None));
    let dir = home.path().join("models/named");
    let gen_cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("generation_config.json")).unwrap())
            .unwrap();
    assert_eq!(gen_cfg["temperature"], 0.2, "{gen_cfg}");
    assert_eq!(gen_cfg["top_p"], 0.9, "{gen_cfg}");

    let want = greedy(home.path(), "named");
    std::fs::rename(&gguf, work.path().join("moved.gguf")).unwrap();
    assert_eq!(greedy(home.path(), "named"), want, "after the source moved");
    let list = ok(&run(h, &["list"], None));
    assert!(
        list.contains("kept in the store") && !list.contains("re-import"),
        "{list}"
    );

    // the kept file changes: refused by name, with the way back
    let kept = dir.join("model.gguf");
    let mut bytes = std::fs::read(&kept).unwrap();
    bytes.extend_from_slice(&[0; 32]);
    std::fs::remove_file(&kept).unwrap();
    std::fs::write(&kept, bytes).unwrap();
    let e = generate(h, "named", &["hi"], None);
    clear_error(
        &e,
        &["model.gguf", "changed", "lamina rm named", "--dtype bf16"],
    );
    let list = ok(&run(h, &["list"], None));
    assert!(list.contains("re-import"), "{list}");
    // its BF16 copy still runs
    ok(&generate(
        h,
        "named",
        &["--dtype", "bf16", "-n", "2", "hi"],
        None,
    ));
}
