//! Any Hugging Face model repo, end to end against a fake hub on a local
//! port (`fake_hub.rs`) serving a sharded synthetic model in the exact
//! Hugging Face layout: `--model org/name` resolves through the store into
//! the standard Hugging Face cache, a download cut off mid-file resumes with
//! `Range` (within the run and from a `.incomplete` blob of an earlier run),
//! a second resolution makes no request at all, the model loaded from the
//! cache generates exactly what the local copy generates, 401 and 403 are
//! explained in one line, and an unsupported architecture is refused before
//! any weight is downloaded. Also the Llama-family variants: Mistral without
//! a sliding window runs as the same network.

mod fake_hub;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use checkpoint::store::Store;
use checkpoint::store::hub::{Hub, RepoRef};
use checkpoint::synth::{Preset, synth_model};
use contract::{KvShape, SamplingParams};
use engine::{Engine, EngineConfig, GenerateRequest};
use fake_hub::{Access, FakeHub};
use safetensors::SafeTensors;
use tokenizer::Tokenizer;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const SHARD1: &str = "model-00001-of-00002.safetensors";

/// The tiny synthetic model in `root/local`, and the same model with its
/// weights split into two shards plus an index in `root/repo`.
fn sharded_tiny(root: &Path) -> (PathBuf, PathBuf) {
    let local = root.join("local");
    synth_model(Preset::Tiny, 11, &local).expect("synth tiny");
    let repo = root.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(local.join(f), repo.join(f)).unwrap();
    }
    let bytes = std::fs::read(local.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let (a, b) = names.split_at(names.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (i, part) in [a, b].into_iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let views: Vec<_> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &repo.join(&file)).unwrap();
        for n in part {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(repo.join("model.safetensors.index.json"), index.to_string()).unwrap();
    (local, repo)
}

/// Eight greedy tokens of the model in `dir` on the CPU backend.
fn greedy(dir: &Path) -> Vec<u32> {
    let loaded = checkpoint::loader::load_config(dir).expect("config");
    let weights = checkpoint::loader::load_weights(dir, &loaded.config).expect("weights");
    let tok = Arc::new(Tokenizer::from_dir(dir).expect("tokenizer"));
    let kv = KvShape {
        num_blocks: 16,
        block_size: 16,
    };
    let backend = model::cpu::CpuBackend::new(loaded.config.clone(), weights, kv).expect("cpu");
    let engine = Engine::start(
        Box::new(backend),
        tok,
        loaded.eos_ids.clone(),
        EngineConfig {
            max_num_seqs: 1,
            max_batch_tokens: 64,
            enable_prefix_cache: false,
            max_queue: 0,
            max_step_time: None,
            halt_on_backend_error: false,
            async_steps: true,
            speculative: None,
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    let out = engine
        .submit(GenerateRequest {
            prompt: vec![5, 17, 42, 99, 3],
            sampling: SamplingParams::greedy(),
            max_tokens: 8,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            constraint: None,
            speculative: true,
            lora: None,
            ignore_eos: true,
        })
        .expect("submit")
        .blocking_collect();
    engine.shutdown();
    assert_eq!(out.tokens.len(), 8, "{:?}", out.error);
    out.tokens
}

/// The whole path a user takes (`--model org/name`, `lamina pull org/name`),
/// configured by the environment as in real use. The only test here that
/// sets environment variables.
#[test]
fn any_repo_downloads_resumes_then_uses_the_cache_without_requests() {
    let tmp = tempfile::tempdir().unwrap();
    let (local, repo_dir) = sharded_tiny(tmp.path());
    let hub = FakeHub::start();
    let repo = "lamina-test/tiny-sharded";
    hub.add_repo(repo, &repo_dir, COMMIT, Access::Public);
    hub.cut_once(repo, SHARD1);
    let cache = tmp.path().join("hf-cache");
    // SAFETY: this test binary's only test that touches the environment
    // (the others pass everything explicitly); no thread reads it concurrently.
    unsafe {
        std::env::set_var("HF_ENDPOINT", &hub.url);
        std::env::set_var("HF_HUB_CACHE", &cache);
        std::env::set_var("HF_HOME", tmp.path().join("hf-home"));
        std::env::set_var("LAMINA_PROGRESS", "plain");
        for k in [
            "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            "HF_TOKEN_PATH",
            "HF_HUB_OFFLINE",
        ] {
            std::env::remove_var(k);
        }
    }
    let store = Store::new(tmp.path().join("lamina"));
    let dir = store.resolve(repo, true).expect("download");
    let repo_cache = cache.join("models--lamina-test--tiny-sharded");
    assert_eq!(dir, repo_cache.join("snapshots").join(COMMIT));
    assert_eq!(
        std::fs::read_to_string(repo_cache.join("refs/main")).unwrap(),
        COMMIT
    );
    // every file of the repo, as a relative symlink into blobs/<etag>
    for e in std::fs::read_dir(&repo_dir).unwrap() {
        let name = e.unwrap().file_name();
        let link = dir.join(&name);
        let target = std::fs::read_link(&link).expect("a symlink");
        assert!(target.starts_with("../../blobs"), "{}", target.display());
        let want = std::fs::read(repo_dir.join(&name)).unwrap();
        assert_eq!(std::fs::read(&link).unwrap(), want, "{name:?}");
        let blob = repo_cache.join("blobs").join(fake_hub::etag(&want));
        assert!(blob.is_file(), "blob named by the (linked) ETag");
    }
    let blobs: Vec<String> = std::fs::read_dir(repo_cache.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !blobs.iter().any(|b| b.ends_with(".incomplete")),
        "{blobs:?}"
    );
    // the cut-off shard was resumed from where it stopped
    let seen = hub.seen();
    let shard_len = std::fs::metadata(repo_dir.join(SHARD1)).unwrap().len();
    let gets: Vec<_> = seen
        .iter()
        .filter(|s| s.method == "GET" && s.path.ends_with(SHARD1))
        .collect();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0].range, None);
    assert_eq!(
        gets[1].range.as_deref(),
        Some(format!("bytes={}-", shard_len / 2).as_str())
    );
    assert!(
        seen[0]
            .path
            .starts_with("/api/models/lamina-test/tiny-sharded/revision/main")
    );
    assert!(!seen.iter().any(|s| s.authorized), "no token, no header");

    // again, through resolve and `lamina pull`'s fetch: the cache, no request
    let before = hub.seen().len();
    assert_eq!(store.resolve(repo, true).unwrap(), dir);
    assert_eq!(store.resolve(repo, false).unwrap(), dir);
    assert_eq!(store.fetch(repo).unwrap(), dir);
    assert_eq!(
        hub.seen().len(),
        before,
        "the cache answers without requests"
    );
    // `lamina list` shows it, with the size of its blobs
    let listed = Hub::from_env().cached_models();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].id.as_str(), &listed[0].path), (repo, &dir));
    let total: u64 = std::fs::read_dir(&repo_dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(listed[0].size_bytes, total);

    // the cached model runs and generates what the local copy generates
    assert_eq!(greedy(&dir), greedy(&local));
}

/// 401 (no token, bad token) and 403 (licence not accepted) are one line
/// saying why; the right token gets the model and is sent on every request.
#[test]
fn refusals_are_explained_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, repo_dir) = sharded_tiny(tmp.path());
    let hub = FakeHub::start();
    hub.add_repo(
        "gated/llama",
        &repo_dir,
        COMMIT,
        Access::Token("hf_good".into()),
    );
    hub.add_repo(
        "gated/licence",
        &repo_dir,
        COMMIT,
        Access::LicenceNotAccepted,
    );
    let cache = tmp.path().join("cache");
    let with = |token: Option<&str>| Hub::new(&hub.url, cache.clone(), token.map(String::from));
    let llama = RepoRef::parse("gated/llama").unwrap();
    let licence = RepoRef::parse("gated/licence").unwrap();

    let one_line = |e: String| {
        assert!(!e.contains('\n'), "one line: {e}");
        e
    };
    let e = one_line(with(None).snapshot(&llama).unwrap_err().to_string());
    assert!(
        e.contains("gated/llama")
            && e.contains("HTTP 401")
            && e.contains("no token")
            && e.contains("HF_TOKEN"),
        "{e}"
    );
    let e = one_line(
        with(Some("hf_bad"))
            .snapshot(&llama)
            .unwrap_err()
            .to_string(),
    );
    assert!(
        e.contains("HTTP 401") && e.contains("HF_TOKEN was rejected"),
        "{e}"
    );
    let e = one_line(
        with(Some("hf_good"))
            .snapshot(&licence)
            .unwrap_err()
            .to_string(),
    );
    assert!(
        e.contains("HTTP 403")
            && e.contains("licence is not accepted")
            && e.contains(&format!("{}/gated/licence", hub.url)),
        "{e}"
    );
    let e = one_line(
        with(None)
            .snapshot(&RepoRef::parse("nobody/nothing").unwrap())
            .unwrap_err()
            .to_string(),
    );
    assert!(
        e.contains("HTTP 401") && e.contains("does not exist"),
        "{e}"
    );
    assert!(!cache.join("models--gated--licence/snapshots").exists());

    let dir = with(Some("hf_good"))
        .snapshot(&llama)
        .expect("with the token");
    assert!(dir.join(SHARD1).is_file());
    let seen = hub.seen();
    assert!(
        seen.iter()
            .filter(|s| s.path.contains("gated/llama"))
            .skip(2) // the two refused listings
            .all(|s| s.authorized),
        "{seen:?}"
    );
}

/// A blob left half-downloaded by an earlier run (`.incomplete`) is resumed
/// from its length; a config of an unsupported architecture stops the
/// download before the weights.
#[test]
fn earlier_partial_downloads_resume_and_bad_configs_stop_early() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, repo_dir) = sharded_tiny(tmp.path());
    let hub = FakeHub::start();
    hub.add_repo("org/tiny", &repo_dir, COMMIT, Access::Public);
    let cache = tmp.path().join("cache");
    let shard = std::fs::read(repo_dir.join(SHARD1)).unwrap();
    let blobs = cache.join("models--org--tiny/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let third = shard.len() / 3;
    std::fs::write(
        blobs.join(format!("{}.incomplete", fake_hub::etag(&shard))),
        &shard[..third],
    )
    .unwrap();
    let hub_client = Hub::new(&hub.url, cache.clone(), None);
    let dir = hub_client
        .snapshot(&RepoRef::parse("org/tiny").unwrap())
        .expect("download");
    assert_eq!(std::fs::read(dir.join(SHARD1)).unwrap(), shard);
    let gets: Vec<_> = hub
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET" && s.path.ends_with(SHARD1))
        .collect();
    assert_eq!(gets.len(), 1);
    assert_eq!(
        gets[0].range.as_deref(),
        Some(format!("bytes={third}-").as_str())
    );

    // an architecture lamina has no spec for: refused at config.json,
    // before any weight request
    let neox = tmp.path().join("neox");
    std::fs::create_dir_all(&neox).unwrap();
    for e in std::fs::read_dir(&repo_dir).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, neox.join(p.file_name().unwrap())).unwrap();
    }
    let cfg = std::fs::read_to_string(neox.join("config.json")).unwrap();
    std::fs::write(
        neox.join("config.json"),
        cfg.replace("LlamaForCausalLM", "GPTNeoXForCausalLM"),
    )
    .unwrap();
    hub.add_repo("org/neox", &neox, COMMIT, Access::Public);
    let e = hub_client
        .snapshot(&RepoRef::parse("org/neox").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("GPTNeoXForCausalLM") && e.contains("architectures"),
        "{e}"
    );
    assert!(
        !hub.seen()
            .iter()
            .any(|s| s.path.contains("org/neox") && s.path.ends_with(".safetensors")),
        "no weight requested"
    );
}

/// Mistral (`MistralForCausalLM`) with no sliding window, or one covering
/// the context, is the Llama network: the same weights generate the same
/// tokens; a shorter window is refused at load naming `sliding_window`.
#[test]
fn mistral_without_a_window_runs_as_llama() {
    let tmp = tempfile::tempdir().unwrap();
    let (local, repo_dir) = sharded_tiny(tmp.path());
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo_dir.join("config.json")).unwrap()).unwrap();
    cfg["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    cfg["model_type"] = "mistral".into();
    cfg["sliding_window"] = serde_json::Value::Null;
    std::fs::write(repo_dir.join("config.json"), cfg.to_string()).unwrap();
    assert_eq!(greedy(&repo_dir), greedy(&local));

    let context = cfg["max_position_embeddings"].as_u64().unwrap();
    cfg["sliding_window"] = (context / 2).into();
    std::fs::write(repo_dir.join("config.json"), cfg.to_string()).unwrap();
    let e = checkpoint::loader::load_config(&repo_dir)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sliding_window") && e.contains("not supported"),
        "{e}"
    );
}
