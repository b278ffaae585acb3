//! Whole-model checks on synthetic llama-3.2-1b weights: the oracle dump
//! (speculative decoding's verify rows included), batch vs alone. (Whole-step figures: `lamina bench`.)

use std::path::PathBuf;

use contract::step_builder::StepBuilder;

use super::*;

#[test]
#[ignore = "needs a CUDA GPU and writes the oracle dump (scripts/gpu/model.sh)"]
fn cuda_llama_1b_dump_for_oracle() {
    let out = PathBuf::from(std::env::var("LAMINA_CHECK_OUT").expect("LAMINA_CHECK_OUT"));
    std::fs::create_dir_all(&out).unwrap();
    // another model directory of the same shape (an FP8 or int4 checkpoint
    // of it, or a GGUF imported into the store, run on its own blocks)
    let dir = std::env::var_os("LAMINA_CHECK_MODEL")
        .map_or_else(|| synth_dir(Preset::Llama3_2_1b), PathBuf::from);
    let (cfg, mut w) = load(&dir);
    if let Some(gguf) = checkpoint::store::source_gguf(&dir).unwrap() {
        let kept =
            checkpoint::quantized::keep_blocks(&gguf, &cfg, &mut w, &crate::cuda::KEPT_GGML_TYPES);
        eprintln!(
            "{}: {} projections in blocks",
            gguf.display(),
            kept.unwrap()
        );
    }
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 1024,
        block_size: BS,
    };
    let mut b = CudaBackend::new(cfg, &w, kv, 0, CudaOptions::default()).unwrap();
    drop(w);
    let mut pool = Pool::new(kv.num_blocks);
    let mut summary = serde_json::Map::new();
    for n in [7usize, 300, 2000] {
        let toks = tokens(n as u64, n, vocab);
        let blocks = pool.take(n);
        let t0 = std::time::Instant::now();
        let logits = chunk_logits(&mut b, &toks, 0, &blocks);
        eprintln!("prefill {n}: {:?} (incl. logits copy)", t0.elapsed());
        write_f32(&out.join(format!("prompt_{n}.f32")), &logits);
        summary.insert(format!("prompt_{n}"), serde_json::json!(toks));
        pool.free.extend(blocks);
    }
    // 64 greedy tokens through step() (decode graphs), then the same with graphs off.
    let prompt = tokens(300, 300, vocab);
    let blocks = pool.take(300 + 64);
    let generated = generate(&mut b, &prompt, &blocks, 64);
    assert!(
        b.num_graphs() >= 1,
        "decode steps should have captured a graph"
    );
    b.set_graphs(false);
    let generated_eager = generate(&mut b, &prompt, &blocks, 64);
    assert_eq!(
        generated, generated_eager,
        "graph replay and eager decode disagree"
    );
    b.set_graphs(true);
    let tf = teacher_forced(&mut b, &prompt, &generated, &blocks);
    let agree = tf
        .chunks(vocab)
        .zip(&generated)
        .filter(|(row, g)| argmax(row) == **g)
        .count();
    assert_eq!(
        agree,
        generated.len(),
        "argmax of the teacher-forced logits vs the GPU-sampled greedy tokens"
    );
    write_f32(&out.join("generated.f32"), &tf);
    summary.insert("gen_prompt".into(), serde_json::json!(prompt));
    summary.insert("generated".into(), serde_json::json!(generated));
    // the same request decoded speculatively, drafting the plain run's tokens:
    // the verify rows' log-probabilities of what they sampled, for the oracle
    let (spec, lps, accepted) = speculative(&mut b, &prompt, &pool.take(300 + 64), &generated);
    assert!(
        accepted > 0,
        "no draft of the plain run's own tokens was accepted"
    );
    summary.insert("spec_tokens".into(), serde_json::json!(spec));
    summary.insert("spec_logprobs".into(), serde_json::json!(lps));
    std::fs::write(
        out.join("tokens.json"),
        serde_json::Value::Object(summary).to_string(),
    )
    .unwrap();
    eprintln!(
        "dumped prompt logits (7, 300, 2000) and 64 teacher-forced rows to {}",
        out.display()
    );
}

/// Greedy decoding of `generated.len()` tokens after `prompt` with verify
/// rows, drafting up to 4 of `generated` (a plain run's tokens) after each
/// accepted prefix: the tokens, their log-probabilities from the rows that
/// sampled them, and how many drafts were accepted.
fn speculative(
    b: &mut CudaBackend,
    prompt: &[u32],
    blocks: &[u32],
    generated: &[u32],
) -> (Vec<u32>, Vec<f32>, usize) {
    let n = generated.len();
    let mut sb = StepBuilder::new(BS);
    sb.push(prompt, 0, blocks, greedy(0)).unwrap();
    let first = b.step(sb.finish()).unwrap()[0].clone().unwrap();
    let (mut toks, mut lps, mut accepted) = (vec![first.token], vec![first.logprob], 0);
    while toks.len() < n {
        let done = toks.len();
        let drafts = &generated[done..(done + 4).min(n)];
        let run: Vec<u32> = std::iter::once(toks[done - 1])
            .chain(drafts.iter().copied())
            .collect();
        sb.begin();
        sb.push(&run, prompt.len() + done - 1, blocks, greedy(done as u64))
            .unwrap();
        sb.set_drafts(drafts.len());
        let mut s = b.step(sb.finish()).unwrap()[0].clone().unwrap();
        let rows = std::mem::take(&mut s.draft_rows);
        for (j, r) in std::iter::once(s).chain(rows).enumerate() {
            toks.push(r.token);
            lps.push(r.logprob);
            if drafts.get(j) != Some(&r.token) || toks.len() == n {
                break;
            }
            accepted += 1;
        }
    }
    (toks, lps, accepted)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_llama_1b_batch_matches_alone() {
    let (cfg, w) = load(&synth_dir(Preset::Llama3_2_1b));
    let mut b = CudaBackend::new(
        cfg,
        &w,
        KvShape {
            num_blocks: 1024,
            block_size: BS,
        },
        0,
        CudaOptions::default(),
    )
    .unwrap();
    drop(w);
    batch_matches_alone(&mut b, 2e-2, "llama-3.2-1b");
}
