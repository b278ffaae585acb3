//! Shared helpers for the end-to-end tests.

/// `z - logsumexp(z)`: a row of logits as log-probabilities, in f64.
pub fn log_softmax(z: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let z: Vec<f64> = z.into_iter().collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    z.into_iter().map(|v| v - lse).collect()
}

/// The weights in `dir` (the store's import of the GGUF at `gguf`) with
/// the projections the GGUF holds in blocks the CPU multiplies kept as
/// those blocks (`checkpoint::quantized::keep_blocks`).
pub fn weights_with_blocks(
    dir: &std::path::Path,
    gguf: &std::path::Path,
    cfg: &contract::ModelConfig,
) -> checkpoint::ModelWeights {
    let mut w = checkpoint::loader::load_weights(dir, cfg).unwrap_or_else(|e| panic!("{e}"));
    checkpoint::quantized::keep_blocks(gguf, cfg, &mut w, &model::cpu::KEPT_GGML_TYPES)
        .unwrap_or_else(|e| panic!("{e}"));
    w
}

/// `name type` of every projection of `w` held in ggml blocks.
pub fn kept_blocks(w: &checkpoint::ModelWeights) -> Vec<String> {
    (w.projections().into_iter())
        .filter_map(|p| match p.format() {
            checkpoint::Format::Ggml(ty) => Some(format!("{} {ty}", p.name())),
            _ => None,
        })
        .collect()
}

/// The fast CPU backend over `weights` as stored, its KV pool sized for one
/// sequence of `tokens` tokens in blocks of `block_size`.
pub fn fast_blocks_backend(
    cfg: &contract::ModelConfig,
    weights: checkpoint::ModelWeights,
    tokens: usize,
    block_size: usize,
) -> model::cpu::CpuBackend {
    let kv = contract::KvShape {
        num_blocks: tokens.div_ceil(block_size),
        block_size,
    };
    model::cpu::CpuBackend::with_weights(
        cfg.clone(),
        weights,
        kv,
        model::cpu::CpuPath::Fast,
        model::cpu::CpuWeights::Stored,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A model of the store (fetched on first use) with its tokenizer, loaded
/// once per test binary.
pub struct StoreModel {
    pub dir: std::path::PathBuf,
    pub tok: std::sync::Arc<tokenizer::Tokenizer>,
}

/// SmolLM2-135M-Instruct from the store, resolved once per test binary.
pub fn smollm2() -> &'static StoreModel {
    static M: std::sync::OnceLock<StoreModel> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        let dir = checkpoint::store::resolve("smollm2-135m-instruct", true)
            .unwrap_or_else(|e| panic!("{e}"));
        let tok = tokenizer::Tokenizer::from_dir(&dir).expect("tokenizer");
        StoreModel {
            dir,
            tok: std::sync::Arc::new(tok),
        }
    })
}

/// Submits every request at once and collects each on its own thread (so
/// streams drain concurrently), in submission order.
pub fn run_all(
    engine: &engine::Engine,
    reqs: &[engine::GenerateRequest],
) -> Vec<engine::Completion> {
    let handles: Vec<_> = reqs
        .iter()
        .map(|r| engine.submit(r.clone()).expect("submit"))
        .collect();
    std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .map(|h| s.spawn(move || h.blocking_collect()))
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("collector"))
            .collect()
    })
}

/// The tiny synthetic model of `seed`, written once per test binary (its
/// folder lives until the binary exits, as a static's would).
pub fn tiny_model(seed: u64) -> &'static std::path::Path {
    use checkpoint::synth::{Preset, synth_model};
    static DIRS: std::sync::Mutex<Vec<(u64, &'static std::path::Path)>> =
        std::sync::Mutex::new(Vec::new());
    let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, d)) = dirs.iter().find(|(s, _)| *s == seed) {
        return d;
    }
    let tmp: &'static tempfile::TempDir =
        Box::leak(Box::new(tempfile::tempdir().expect("temp dir")));
    let dir: &'static std::path::Path = Box::leak(tmp.path().join("tiny").into_boxed_path());
    synth_model(Preset::Tiny, seed, dir).expect("synth tiny model");
    dirs.push((seed, dir));
    dir
}
