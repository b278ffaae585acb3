//! Any family against transformers: the model in `LAMINA_CHECK_MODEL`
//! (Gemma 3, Qwen3, Qwen2.5, Llama; default the synthetic gemma-3-270m)
//! run on the CUDA backend, what it computes dumped into `LAMINA_CHECK_OUT`
//! for `scripts/gpu/compare_hf.py` (transformers in float32 on the same
//! weights), then batch vs alone. `scripts/gpu/families.sh` runs it for
//! each synthetic preset.
//!
//! Cases: prompts of 7, 300 and 2,000 random tokens (`LAMINA_CHECK_LENS`,
//! comma-separated; 2,000 is past Gemma 3's 512-token window), and 64
//! greedy tokens after a 300-token prompt (`LAMINA_CHECK_GEN`), decoded
//! through `step` (graphs) and scored teacher-forced one token at a time.
//!
//! What is kept: a 262,144-token vocabulary makes the logits of a
//! 2,000-token prompt 2 GB of f32, so each case keeps
//! - at every scored position, the log-probability of the next token
//!   (teacher-forced; the generated token for the generated case) and the
//!   row's argmax, in `dump.json`;
//! - the whole logit rows of a few positions in `{case}.f32` (`[rows,
//!   vocab]`, little-endian, row-major): every position of a prompt of at
//!   most [`KEPT_ROWS`] tokens, else [`KEPT_ROWS`] spread evenly (first and
//!   last included) and the two either side of each sliding window's edge;
//!   every row of the generated case.
//!
//! compare_hf.py takes max |Δ log-probability| over the teacher-forced
//! tokens of every position and over the whole vocabulary of the kept
//! rows, and the relative error of the kept rows' logits. Prompt logits
//! are read [`ROW_CHUNK`] rows a call (the whole prompt recomputed each
//! time), so the backend's logits buffer stays small.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;
use crate::cpu::{CpuBackend, CpuPath};

/// Whole rows kept of a longer prompt.
const KEPT_ROWS: usize = 16;
/// Prompt rows asked of the backend in one logits call.
const ROW_CHUNK: usize = 256;
/// The KV pool: 16,384 tokens.
const KV: KvShape = KvShape {
    num_blocks: 1024,
    block_size: BS,
};

#[test]
#[ignore = "needs a CUDA GPU; writes the dump for compare_hf.py (scripts/gpu/families.sh)"]
fn cuda_family_dump_for_transformers() {
    let (dir, out, label) = paths();
    let (cfg, w) = load(&dir);
    let mut b = CudaBackend::new(cfg, &w, KV, 0, CudaOptions::default()).unwrap();
    drop(w);
    let (prompt, generated) = dump(&mut b, &out, &label);
    // The dump decoded with graphs, but its later scoring grew the
    // workspace, which drops them: decode again with graphs, count them at
    // once, then eagerly; all three must give the same tokens.
    let blocks = Pool::new(KV.num_blocks).take(prompt.len() + generated.len());
    let replayed = generate(&mut b, &prompt, &blocks, generated.len());
    let graphs = b.num_graphs();
    let failure = b.graph_failure().map(str::to_string);
    b.set_graphs(false);
    let eager = generate(&mut b, &prompt, &blocks, generated.len());
    b.set_graphs(true);
    println!(
        "RESULT {label} decode graphs captured: {graphs}; eager decode equals graph replay: {}",
        eager == generated && replayed == generated
    );
    batch_matches_alone(&mut b, 2e-2, &label);
    assert!(
        graphs >= 1,
        "{label}: decode steps captured no graph ({})",
        failure.as_deref().unwrap_or("no capture failed")
    );
    assert_eq!(
        replayed, generated,
        "{label}: a second graph replay disagrees with the first"
    );
    assert_eq!(
        eager, generated,
        "{label}: graph replay and eager decode disagree"
    );
}

/// The same dump from the CPU backend (its fast path): checks the dump and
/// compare_hf.py on a machine without a GPU, e.g. on a `--layers 1` cut
/// with `LAMINA_CHECK_LENS=7,40 LAMINA_CHECK_GEN=4`.
#[test]
#[ignore = "writes the dump for compare_hf.py; LAMINA_CHECK_MODEL and LAMINA_CHECK_OUT"]
fn cpu_family_dump_for_transformers() {
    let (dir, out, label) = paths();
    let (cfg, w) = load(&dir);
    let mut b = CpuBackend::with_path(cfg, w, KV, CpuPath::Fast).unwrap();
    dump(&mut b, &out, &label);
}

/// The model directory, the dump's (created) and the model's name (its
/// directory's).
fn paths() -> (PathBuf, PathBuf, String) {
    let out = PathBuf::from(std::env::var("LAMINA_CHECK_OUT").expect("LAMINA_CHECK_OUT"));
    std::fs::create_dir_all(&out).unwrap();
    let dir = std::env::var_os("LAMINA_CHECK_MODEL")
        .map_or_else(|| synth_dir(Preset::Gemma3_270m), PathBuf::from);
    let label = dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    (dir, out, label)
}

/// A comma-separated list of numbers from the environment, or `default`.
fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    match std::env::var(name) {
        Ok(s) => s
            .split(',')
            .map(|v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{name}={s:?}: {v:?}: {e}"))
            })
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// One scored sequence: row `first + j` of `tokens` (one prefill from
/// position 0) scores `targets[j]`; `keep` (ascending) are the positions
/// whose whole rows are written.
struct Case {
    name: String,
    tokens: Vec<u32>,
    first: usize,
    targets: Vec<u32>,
    keep: Vec<usize>,
}

/// What the dump keeps of one case's logits.
#[derive(Default)]
struct Kept {
    logprobs: Vec<f64>,
    argmax: Vec<u32>,
    rows: Vec<f32>, // [keep.len(), vocab]
}

impl Kept {
    /// Takes row `pos` of `case`'s logits (rows come in ascending order).
    fn take(&mut self, case: &Case, pos: usize, row: &[f32]) {
        assert!(
            row.iter().all(|x| x.is_finite()),
            "{}: non-finite logits at position {pos}",
            case.name
        );
        if let Some(&t) = pos
            .checked_sub(case.first)
            .and_then(|j| case.targets.get(j))
        {
            self.logprobs.push(logprob(row, t));
            self.argmax.push(argmax(row));
        }
        if case.keep.binary_search(&pos).is_ok() {
            self.rows.extend_from_slice(row);
        }
    }
}

/// log softmax(row)[t], in f64.
fn logprob(row: &[f32], t: u32) -> f64 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    row[t as usize] as f64 - lse
}

/// The positions of an `n`-token prompt whose whole rows are kept.
fn kept_positions(n: usize, windows: &BTreeSet<usize>) -> Vec<usize> {
    if n <= KEPT_ROWS {
        return (0..n).collect();
    }
    let spread = (0..KEPT_ROWS).map(|i| i * (n - 1) / (KEPT_ROWS - 1));
    let edges = windows.iter().flat_map(|&w| [w - 1, w]);
    let all: BTreeSet<usize> = spread.chain(edges).filter(|&p| p < n).collect();
    all.into_iter().collect()
}

/// Runs every case on `b`, writes `dump.json` and the kept rows into
/// `out`, prints a line per case; returns the generated case's prompt and
/// its greedy tokens.
fn dump(b: &mut dyn Backend, out: &Path, label: &str) -> (Vec<u32>, Vec<u32>) {
    let cfg = b.config().clone();
    let vocab = cfg.vocab_size;
    let windows: BTreeSet<usize> = (cfg.spec.layers.iter())
        .filter_map(|l| l.attention.window)
        .collect();
    let lens = env_list("LAMINA_CHECK_LENS", &[7, 300, 2000]);
    let n_gen = env_list("LAMINA_CHECK_GEN", &[64])[0];
    let gen_len = 300.min(lens.iter().copied().max().unwrap_or(300));
    let most = lens
        .iter()
        .copied()
        .chain([gen_len + n_gen])
        .max()
        .unwrap_or(0);
    assert!(
        most <= KV.num_blocks * BS && n_gen >= 1 && lens.iter().all(|&n| n >= 1),
        "LAMINA_CHECK_LENS {lens:?} / LAMINA_CHECK_GEN {n_gen}: each at least 1 token, at most {} with the generated ones",
        KV.num_blocks * BS
    );
    let mut pool = Pool::new(KV.num_blocks);
    let mut cases = Vec::new();
    for &n in &lens {
        let toks = tokens(n as u64, n, vocab);
        let case = Case {
            name: format!("prompt_{n}"),
            targets: toks[1..].to_vec(),
            first: 0,
            keep: kept_positions(n, &windows),
            tokens: toks,
        };
        let blocks = pool.take(n);
        let t0 = std::time::Instant::now();
        let mut kept = Kept::default();
        for lo in (0..n).step_by(ROW_CHUNK) {
            let rows: Vec<usize> = (lo..n.min(lo + ROW_CHUNK)).collect();
            let logits = chunk_rows_logits(b, &case.tokens, 0, &blocks, &rows);
            for (&p, row) in rows.iter().zip(logits.chunks(vocab)) {
                kept.take(&case, p, row);
            }
        }
        eprintln!(
            "{}: {:?} (prefills, logits copies, reductions)",
            case.name,
            t0.elapsed()
        );
        pool.free.extend(blocks);
        cases.push((case, kept));
    }
    let prompt = tokens(300, gen_len, vocab);
    let blocks = pool.take(gen_len + n_gen);
    let generated = generate(b, &prompt, &blocks, n_gen);
    let tf = teacher_forced(b, &prompt, &generated, &blocks);
    let case = Case {
        name: format!("generated_{n_gen}"),
        tokens: [&prompt[..], &generated[..n_gen - 1]].concat(),
        first: gen_len - 1,
        targets: generated.clone(),
        keep: (gen_len - 1..gen_len - 1 + n_gen).collect(),
    };
    let mut kept = Kept::default();
    for (j, row) in tf.chunks(vocab).enumerate() {
        kept.take(&case, case.first + j, row);
    }
    let agree = kept
        .argmax
        .iter()
        .zip(&generated)
        .filter(|(a, g)| a == g)
        .count();
    println!(
        "RESULT {} greedy tokens = argmax of their teacher-forced rows: {agree}/{n_gen}",
        label
    );
    cases.push((case, kept));
    write_dump(out, label, vocab, &cases);
    (prompt, generated)
}

/// `dump.json` (every case but its kept rows) and `{case}.f32` (those).
fn write_dump(out: &Path, model: &str, vocab: usize, cases: &[(Case, Kept)]) {
    let mut list = Vec::new();
    for (c, k) in cases {
        let file = format!("{}.f32", c.name);
        write_f32(&out.join(&file), &k.rows);
        list.push(json!({
            "name": c.name, "tokens": c.tokens, "first": c.first, "targets": c.targets,
            "logprobs": k.logprobs, "argmax": k.argmax, "keep": c.keep, "file": file,
        }));
        let worst = k.logprobs.iter().copied().fold(0.0, f64::min);
        println!(
            "{model} {}: {} scored positions (lowest log-probability {worst:.2}), {} whole rows kept",
            c.name,
            k.logprobs.len(),
            c.keep.len()
        );
    }
    let body = json!({"model": model, "vocab": vocab, "cases": list});
    std::fs::write(out.join("dump.json"), body.to_string()).unwrap();
    eprintln!("dumped {} cases to {}", cases.len(), out.display());
}
