//! Whole-model checks on synthetic llama-3.2-1b weights: the oracle dump,
//! batch vs alone, graph replay vs eager, and step timings.

use std::path::PathBuf;

use super::*;

#[test]
#[ignore = "needs a CUDA GPU and writes the oracle dump (scripts/gpu/model.sh)"]
fn cuda_llama_1b_dump_for_oracle() {
    let out = PathBuf::from(std::env::var("LAMINA_CHECK_OUT").expect("LAMINA_CHECK_OUT"));
    std::fs::create_dir_all(&out).unwrap();
    let dir = synth_dir(Preset::Llama3_2_1b);
    let (cfg, w) = load(&dir);
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

/// Wall time per step (prefill of 2000 tokens; greedy decode at batch 1 and
/// 8 with graphs on and off), printed as RESULT lines. Correctness is checked
/// elsewhere; this only reports figures.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_llama_1b_step_timing() {
    let (cfg, w) = load(&synth_dir(Preset::Llama3_2_1b));
    let vocab = cfg.vocab_size;
    let mut b = CudaBackend::new(
        cfg,
        &w,
        KvShape {
            num_blocks: 2048,
            block_size: BS,
        },
        0,
        CudaOptions::default(),
    )
    .unwrap();
    drop(w);
    let mut pool = Pool::new(2048);
    let prompt = tokens(5, 2000, vocab);
    let blocks = pool.take(2000);
    let chunk = SeqChunk {
        prompt_len: 0,
        tokens: prompt,
        start: 0,
        blocks,
        sample: greedy(0),
    };
    let batch = build_step(&[chunk], BS).unwrap();
    b.step(&batch).unwrap();
    let t0 = std::time::Instant::now();
    for _ in 0..5 {
        b.step(&batch).unwrap();
    }
    println!(
        "RESULT prefill 2000 tokens: {:.2} ms/step",
        t0.elapsed().as_secs_f64() * 1e3 / 5.0
    );
    for graphs in [true, false] {
        b.set_graphs(graphs);
        for bs in [1usize, 8] {
            let mut chunks: Vec<SeqChunk> = (0..bs)
                .map(|i| SeqChunk {
                    prompt_len: 0,
                    tokens: tokens(i as u64, 512, vocab),
                    start: 0,
                    blocks: pool.take(512 + 130),
                    sample: greedy(0),
                })
                .collect();
            let steps = 128;
            let mut t0 = std::time::Instant::now();
            for s in 0..steps {
                if s == 2 {
                    t0 = std::time::Instant::now(); // after prefill and graph capture
                }
                let res = b.step(&build_step(&chunks, BS).unwrap()).unwrap();
                for (c, r) in chunks.iter_mut().zip(res) {
                    c.start += c.tokens.len();
                    c.tokens = vec![r.unwrap().token];
                }
            }
            let ms = t0.elapsed().as_secs_f64() * 1e3 / (steps - 2) as f64;
            println!(
                "RESULT decode batch {bs} graphs {graphs}: {ms:.3} ms/step ({:.0} tok/s)",
                bs as f64 * 1e3 / ms
            );
            if graphs {
                // The GPU's share of a step: the bucket's graph replayed back
                // to back (same inputs), no host work in between.
                // the bucket of the last step (its block-table rows are the longest)
                let graph = b
                    .graphs
                    .graphs
                    .iter()
                    .filter(|((sb, _, _), _)| *sb == bs.next_power_of_two())
                    .max_by_key(|((_, mb, _), _)| *mb)
                    .map(|(_, g)| g)
                    .unwrap();
                let reps = 50;
                let t = b.gpu.timer().unwrap();
                t.start().unwrap();
                for _ in 0..reps {
                    graph.launch(&b.gpu).unwrap();
                }
                let us = t.stop_ms().unwrap() as f64 * 1e3 / reps as f64;
                println!(
                    "RESULT decode batch {bs} graph replay alone: {us:.1} us/step (host and sync: {:.1} us/step)",
                    ms * 1e3 - us
                );
            }
            for c in chunks {
                pool.free.extend(c.blocks);
            }
        }
    }
}
