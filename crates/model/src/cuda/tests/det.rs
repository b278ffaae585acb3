//! Deterministic mode on the device: a sequence's logits are bit for bit
//! the same whatever shares its steps and however its tokens are cut into
//! steps (one prompt, small chunks, one token a step as decoding or
//! recomputation after preemption would run them), and its greedy tokens
//! and their log-probabilities the same alone and in a batch on the
//! decode graphs. The default mode differs in some of them (so the test
//! can fail).

use super::*;

/// The prompt lengths the scenarios follow, and where decoding starts in
/// each: short, and past `DETERMINISTIC_FLASH_KEYS` (the flash tiling up to
/// it, the decode kernel from there).
const SHORT: (usize, usize) = (300, 200);
const LONG: (usize, usize) = (2300, 2040);

/// The backend in the default mode (`None`) or the deterministic one with
/// its GEMMs on `Some(choice)`.
fn backend(preset: Preset, det: Option<DetGemm>) -> CudaBackend {
    let (cfg, w) = load(&synth_dir(preset));
    let kv = KvShape {
        num_blocks: 4096,
        block_size: BS,
    };
    let opts = CudaOptions {
        deterministic: det.is_some(),
        det_gemm: det.unwrap_or_default(),
        ..CudaOptions::default()
    };
    CudaBackend::new(cfg, &w, kv, 0, opts).unwrap()
}

/// Logits of the rows of `chunks[0]` (all its tokens) in one step of `chunks`.
fn first_rows(b: &mut dyn Backend, chunks: &[SeqChunk]) -> Vec<f32> {
    let batch = build_step(chunks, BS).unwrap();
    let rows: Vec<usize> = (0..chunks[0].tokens.len()).collect();
    b.logits(&batch, &rows).unwrap()
}

fn chunk(tokens: &[u32], start: usize, blocks: &[u32]) -> SeqChunk {
    SeqChunk {
        prompt_len: 0,
        tokens: tokens.to_vec(),
        start,
        blocks: blocks.to_vec(),
        sample: None,
    }
}

/// One scenario's logits: its label, the first position they are for, the rows.
type Scenario = (&'static str, usize, Vec<f32>);

/// (token, log-probability bits) of each sampled row, in step order.
type Draws = Vec<(u32, u32)>;

/// The prompt's logits in each scenario, and the whole prompt's (one step,
/// alone) to compare them with.
fn scenarios(b: &mut dyn Backend, (len, from): (usize, usize)) -> (Vec<f32>, Vec<Scenario>) {
    let (vocab, max_pos) = (b.config().vocab_size, b.config().max_position_embeddings);
    let p = tokens(36, len, vocab);
    let mut pool = Pool::new(b.kv_shape().num_blocks);
    let whole = chunk_logits(b, &p, 0, &pool.take(len));
    let mut out = Vec::new();
    // in one step with 7 other prompts
    let tab = pool.take(len);
    let mut chunks = vec![chunk(&p, 0, &tab)];
    for (i, n) in [3usize, 17, 64, 129, 511, 1000, 33].into_iter().enumerate() {
        let n = n.min(max_pos);
        chunks.push(chunk(&tokens(i as u64, n, vocab), 0, &pool.take(n)));
    }
    out.push(("prompt in a batch of 8", 0, first_rows(b, &chunks)));
    // in chunks of 7 tokens
    let tab = pool.take(len);
    let rows: Vec<f32> = (0..len)
        .step_by(7)
        .flat_map(|s| chunk_logits(b, &p[s..(s + 7).min(len)], s, &tab))
        .collect();
    out.push(("prompt in 7-token chunks", 0, rows));
    // decoded one token a step, alone and beside 4 other sequences
    let tab = pool.take(len);
    let _ = chunk_logits(b, &p[..from], 0, &tab);
    let rows: Vec<f32> = (from..len)
        .flat_map(|i| chunk_logits(b, &p[i..i + 1], i, &tab))
        .collect();
    out.push(("one token a step, alone", from, rows));
    let tab = pool.take(len);
    let _ = chunk_logits(b, &p[..from], 0, &tab);
    let others: Vec<(Vec<u32>, Vec<u32>)> = (0..4)
        .map(|i| (tokens(50 + i, len, vocab), pool.take(len)))
        .collect();
    for (t, bl) in &others {
        let _ = chunk_logits(b, &t[..from + 17], 0, bl);
    }
    let rows: Vec<f32> = (from..len - 17)
        .flat_map(|i| {
            let mut c = vec![chunk(&p[i..i + 1], i, &tab)];
            c.extend(
                others
                    .iter()
                    .map(|(t, bl)| chunk(&t[i + 17..i + 18], i + 17, bl)),
            );
            first_rows(b, &c)
        })
        .collect();
    out.push(("one token a step, in a batch of 5", from, rows));
    (whole, out)
}

/// Which scenarios' rows differ from the whole prompt's, bit for bit.
fn differing(b: &mut dyn Backend, label: &str, shape: (usize, usize)) -> Vec<&'static str> {
    let vocab = b.config().vocab_size;
    let (whole, cases) = scenarios(b, shape);
    let mut differ = Vec::new();
    for (what, from, rows) in cases {
        let want = &whole[from * vocab..][..rows.len()];
        let same = rows
            .iter()
            .zip(want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        println!(
            "RESULT {label}, {} tokens: {what}: {} (max |dlogprob| {:.2e})",
            shape.0,
            if same { "bit-identical" } else { "differs" },
            max_lp_diff(&rows, want, vocab)
        );
        if !same {
            differ.push(what);
        }
    }
    differ
}

/// Greedy tokens and log-probability bits of 3 sequences decoded together
/// on the graphs, and of each alone.
fn greedy_alone_and_batched(b: &mut CudaBackend) -> (Draws, Draws) {
    let vocab = b.config().vocab_size;
    let mut pool = Pool::new(b.kv_shape().num_blocks);
    let prompts: Vec<Vec<u32>> = [40usize, 7, 200]
        .iter()
        .map(|&n| tokens(n as u64 + 3, n, vocab))
        .collect();
    let mut run = |group: &[usize]| -> Draws {
        let mut cs: Vec<SeqChunk> = group
            .iter()
            .map(|&i| SeqChunk {
                sample: greedy(0),
                ..chunk(&prompts[i], 0, &pool.take(prompts[i].len() + 32))
            })
            .collect();
        let mut out = Vec::new();
        for step in 0..24u64 {
            let got = b.step(&build_step(&cs, BS).unwrap()).unwrap();
            for (c, t) in cs.iter_mut().zip(got) {
                let t = t.unwrap();
                out.push((t.token, t.logprob.to_bits()));
                c.start += c.tokens.len();
                c.tokens = vec![t.token];
                c.sample = greedy(step + 1);
            }
        }
        out
    };
    let batched = run(&[0, 1, 2]);
    let alone: Vec<Draws> = (0..3).map(|i| run(&[i])).collect();
    // interleave the lone runs as the batch returned them
    let alone = (0..24)
        .flat_map(|s| alone.iter().map(move |a| a[s]))
        .collect();
    (batched, alone)
}

/// smollm2 runs attention on the flash kernel's fixed tiling, tiny (head
/// size 16, which flash does not serve) on the decode kernel's token rows;
/// each with its GEMMs on cuBLASLt, on the own kernel and as timed.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_deterministic_rows_are_bit_identical_in_any_step() {
    let cases = [
        (Preset::Smollm2_135m, vec![SHORT, LONG]),
        (Preset::Tiny, vec![SHORT]),
    ];
    let gemms = [DetGemm::CublasLt, DetGemm::Own, DetGemm::Auto];
    for ((preset, shapes), gemm) in cases
        .iter()
        .flat_map(|c| gemms.iter().map(move |g| (c, *g)))
    {
        let mut det = backend(*preset, Some(gemm));
        assert!(det.deterministic() && det.name().contains("deterministic"));
        let label = format!("deterministic {} ({gemm:?} GEMMs)", preset.name());
        for &shape in shapes {
            let differ = differing(&mut det, &label, shape);
            assert!(
                differ.is_empty(),
                "{label}, {} tokens differ: {differ:?}",
                shape.0
            );
        }
        let (batched, alone) = greedy_alone_and_batched(&mut det);
        assert_eq!(
            batched, alone,
            "{label}: greedy tokens / logprob bits, batched vs alone"
        );
        assert!(det.num_graphs() > 0, "the decode steps ran on graphs");
        println!("RESULT {label}: greedy tokens and logprob bits equal batched and alone");
    }
    let mut default = backend(Preset::Smollm2_135m, None);
    let differ = differing(&mut default, "default", SHORT);
    assert!(
        !differ.is_empty(),
        "the default mode's rows matched in every scenario: the check cannot fail"
    );
}
