//! Embedding requests on the fake backend: every vector equals the fake
//! model's pooled state of its whole input (so chunking, fresh blocks and
//! batching with other inputs and with generation read the right K/V),
//! the refusals name the input and the limit, and no KV block outlives a
//! request.

use engine::testing::{fake_hidden, reference_generate};
use engine::{EmbedError, EmbedRequest, Embeddings, Engine, Pooling};

use super::*;

fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

/// What a correct engine returns for `ids`.
fn expected(ids: &[u32], hidden: usize, pooling: Pooling) -> Vec<f32> {
    match pooling {
        Pooling::Last => normalised(fake_hidden(ids, hidden)),
        Pooling::Mean => {
            let mut acc = vec![0f32; hidden];
            for end in 1..=ids.len() {
                for (a, v) in acc.iter_mut().zip(fake_hidden(&ids[..end], hidden)) {
                    *a += v;
                }
            }
            normalised(acc)
        }
    }
}

fn embed(
    engine: &Engine,
    inputs: Vec<Vec<u32>>,
    pooling: Pooling,
) -> Result<Embeddings, EmbedError> {
    engine
        .embed(EmbedRequest { inputs, pooling })?
        .blocking_wait()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-5, "{what}: value {i}: {g} vs {w}");
    }
}

fn wait_blocks_free(engine: &Engine) {
    for _ in 0..2000 {
        if engine.stats().kv_blocks_used == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("KV blocks still held: {:?}", engine.stats());
}

#[test]
fn vectors_are_the_pooled_states_of_whole_inputs() {
    // a step budget of 32 cuts the long inputs into chunks over several passes
    let s = start(64, 16, cfg(8, 32));
    let hidden = s.config.hidden_size;
    let inputs: Vec<Vec<u32>> = [1, 3, 17, 130, 64, 31]
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(n, i as u32))
        .collect();
    for pooling in Pooling::ALL {
        let out = embed(&s.engine, inputs.clone(), pooling).unwrap();
        assert_eq!(out.vectors.len(), inputs.len());
        assert_eq!(
            out.prompt_tokens,
            inputs.iter().map(Vec::len).sum::<usize>()
        );
        for (i, (v, ids)) in out.vectors.iter().zip(&inputs).enumerate() {
            assert_close(
                v,
                &expected(ids, hidden, pooling),
                &format!("{pooling} input {i}"),
            );
        }
        // alone, each is the same vector
        let alone = embed(&s.engine, vec![inputs[3].clone()], pooling).unwrap();
        assert_close(&alone.vectors[0], &out.vectors[3], "alone vs batched");
    }
    wait_blocks_free(&s.engine);
}

#[test]
fn embeddings_run_beside_generation() {
    let s = start(48, 16, cfg(4, 64));
    let hidden = s.config.hidden_size;
    let gens: Vec<GenerateRequest> = (0..6)
        .map(|i| req(prompt(20 + 9 * i, i as u32), 24, SamplingParams::greedy()))
        .collect();
    let want: Vec<Vec<u32>> = gens
        .iter()
        .map(|r| {
            reference_generate(
                &r.prompt,
                s.config.vocab_size,
                &r.sampling,
                24,
                &s.eos,
                true,
            )
        })
        .collect();
    let engine = s.engine.clone();
    let embedder = std::thread::spawn(move || {
        (0..8u32)
            .map(|k| {
                let inputs = vec![prompt(40 + k as usize * 11, 100 + k), prompt(5, 200 + k)];
                (inputs.clone(), embed(&engine, inputs, Pooling::Mean))
            })
            .collect::<Vec<_>>()
    });
    let done = run_all(&s.engine, gens);
    for (c, w) in done.iter().zip(&want) {
        assert_eq!(&c.tokens, w);
    }
    for (inputs, out) in embedder.join().unwrap() {
        let out = out.unwrap();
        for (v, ids) in out.vectors.iter().zip(&inputs) {
            assert_close(
                v,
                &expected(ids, hidden, Pooling::Mean),
                "beside generation",
            );
        }
    }
    wait_idle(&s.engine);
    wait_blocks_free(&s.engine);
}

#[test]
fn inputs_wait_for_blocks_in_a_small_pool() {
    // 8 blocks of 16: each 100-token input takes 7, so they run one by one
    let s = start(8, 16, cfg(4, 48));
    let hidden = s.config.hidden_size;
    let inputs: Vec<Vec<u32>> = (0..3).map(|i| prompt(100, i)).collect();
    let out = embed(&s.engine, inputs.clone(), Pooling::Last).unwrap();
    for (v, ids) in out.vectors.iter().zip(&inputs) {
        assert_close(v, &expected(ids, hidden, Pooling::Last), "small pool");
    }
    wait_blocks_free(&s.engine);
}

#[test]
fn refusals_name_the_input_and_the_limit() {
    let s = start(64, 16, cfg(8, 64));
    let e = &s.engine;
    let limit = e.max_sequence();
    let too_long = prompt(limit + 1, 0);
    let vocab = s.config.vocab_size as u32;
    let cases = [
        (vec![], EmbedError::NoInput),
        (vec![vec![5], vec![]], EmbedError::Empty { index: 1 }),
        (
            vec![vec![5], too_long],
            EmbedError::TooLong {
                index: 1,
                tokens: limit + 1,
                limit,
            },
        ),
        (
            vec![vec![5, vocab]],
            EmbedError::OutOfVocab {
                index: 0,
                token: vocab,
                position: 1,
                vocab: vocab as usize,
            },
        ),
    ];
    for (inputs, want) in cases {
        assert_eq!(embed(e, inputs, Pooling::Last).unwrap_err(), want);
    }
    let many = vec![vec![5]; engine::embed::MAX_EMBED_INPUTS + 1];
    let err = embed(e, many, Pooling::Last).unwrap_err();
    assert!(err.to_string().contains("at most 2048"), "{err}");
    // an input as long as the limit is embedded
    assert!(embed(e, vec![prompt(limit, 3)], Pooling::Last).is_ok());
}

#[test]
fn a_failed_pass_ends_only_its_request() {
    let s = start_with(64, 16, cfg(8, 64), |b| b.with_fail_on_token(7));
    let err = embed(&s.engine, vec![vec![3, 7, 9]], Pooling::Last).unwrap_err();
    assert!(
        matches!(err, EmbedError::Backend(ref m) if m.contains("token 7")),
        "{err}"
    );
    // a dropped handle's job is dropped too
    drop(s.engine.embed(EmbedRequest {
        inputs: vec![prompt(200, 1)],
        pooling: Pooling::Mean,
    }));
    let ok = embed(&s.engine, vec![vec![3, 9]], Pooling::Last).unwrap();
    assert_eq!(ok.vectors.len(), 1);
    wait_blocks_free(&s.engine);
}
