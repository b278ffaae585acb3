//! Speculative decoding on the CPU backend with SmolLM2: over 50 chat
//! prompts (copy-heavy edits and extractions, and open questions with
//! nothing to copy), greedy outputs with n-gram and with suffix drafts are
//! token for token those of plain decoding, batched and alone; seeded
//! sampled outputs too, and those of requests with penalties, a logit
//! bias, stop strings and log-probabilities (text and log-probabilities
//! equal too); drafts are really verified and many accepted (the
//! counters say so), and suffix decoding replaying a finished request
//! accepts most of its drafts. With SmolLM2 drafting for itself (the
//! draft-model drafter, its own backend and KV pool), over 20 of the
//! prompts the outputs are again plain decoding's, batched and alone, and
//! greedy drafts are nearly all accepted; sequences drafting together get
//! the drafts each gets alone. Constrained requests (a JSON schema, a
//! regular expression) draft too: their greedy outputs with n-gram and
//! suffix drafts are plain decoding's, batched and alone, and valid.
//!
//! Costs: SmolLM2 (270 MB) is loaded once per engine (fetched through the
//! store on first use); 50 prompts x 24 tokens per run, a few runs: about
//! a minute on 2 cores in release.

use std::sync::OnceLock;

use contract::{KvShape, SamplingParams};
use engine::speculate::{DraftModel, DraftModelDrafter, Drafter, Proposal};
use engine::{
    Completion, Constraint, Engine, EngineConfig, FinishReason, GenerateRequest, SpecConfig,
    SpecMethod,
};
use tokenizer::ChatMessage;

const MAX_TOKENS: usize = 24;

/// SmolLM2 on the fast CPU path with a pool of 512 blocks of 16.
fn smollm2_backend() -> (model::cpu::CpuBackend, checkpoint::loader::LoadedModel) {
    let m = lamina_tests::smollm2();
    let loaded = checkpoint::loader::load_config(&m.dir).expect("config");
    let weights = checkpoint::loader::load_weights(&m.dir, &loaded.config).expect("weights");
    let kv = KvShape {
        num_blocks: 512,
        block_size: 16,
    };
    let backend = model::cpu::CpuBackend::with_path(
        loaded.config.clone(),
        weights,
        kv,
        model::cpu::CpuPath::Fast,
    )
    .expect("cpu backend");
    (backend, loaded)
}

fn start(spec: Option<SpecMethod>) -> Engine {
    let m = lamina_tests::smollm2();
    let (backend, loaded) = smollm2_backend();
    Engine::start(
        Box::new(backend),
        m.tok.clone(),
        loaded.eos_ids.clone(),
        EngineConfig {
            max_num_seqs: 64,
            max_batch_tokens: 2048,
            speculative: spec.map(|method| SpecConfig {
                method,
                num_tokens: 5,
                max_batch: 64,
            }),
            ..EngineConfig::default()
        },
    )
    .expect("engine")
}

const TEXTS: [&str; 10] = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "fn add(a: i32, b: i32) -> i32 { a + b }",
    "Alice met Bob in Paris on Monday, and Carol joined them on Tuesday.",
    "def greet(name):\n    print('Hello, ' + name)\n",
    "Water boils at 100 degrees Celsius at sea level.",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name;",
    "The meeting is moved from 3 pm to 4 pm in room 12B.",
    "for i in range(10):\n    total += i * i\n",
    "Berlin, Madrid and Rome are capitals of European countries.",
    "let v: Vec<u32> = (0..5).map(|x| x * 2).collect();",
];

const TASKS: [&str; 5] = [
    "Repeat this text exactly:",
    "Rewrite this text in capital letters:",
    "Copy the following, then say what it is:",
    "Quote this back to me word for word:",
    "Explain in one sentence:",
];

/// 50 chat prompts: every task over every text.
fn prompts() -> Vec<Vec<u32>> {
    TASKS
        .iter()
        .flat_map(|task| TEXTS.iter().map(move |text| format!("{task}\n{text}")))
        .map(|q| {
            lamina_tests::smollm2()
                .tok
                .encode_chat(&[ChatMessage::new("user", &q)])
                .expect("chat template")
        })
        .collect()
}

fn request(prompt: Vec<u32>, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling,
        max_tokens: MAX_TOKENS,
        stop: Vec::new(),
        ignore_eos: false,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative: true,
        lora: None,
    }
}

fn requests() -> Vec<GenerateRequest> {
    prompts()
        .into_iter()
        .enumerate()
        .map(|(i, p)| match i % 10 {
            // every tenth seeded and sampled
            3 => request(
                p,
                SamplingParams {
                    temperature: 0.8,
                    seed: i as u64,
                    ..SamplingParams::default()
                },
            ),
            // penalties (each verify row's history counts the drafts before it)
            6 => request(
                p,
                SamplingParams {
                    repetition_penalty: 1.3,
                    presence_penalty: 0.4,
                    frequency_penalty: 0.3,
                    logprobs: 2,
                    ..SamplingParams::greedy()
                },
            ),
            // seeded with a logit bias and a frequency penalty, log-probabilities
            8 => request(
                p,
                SamplingParams {
                    temperature: 0.9,
                    seed: i as u64,
                    frequency_penalty: 0.5,
                    logit_bias: vec![(13, 2.0), (28, -3.0)].into(),
                    logprobs: 3,
                    ..SamplingParams::default()
                },
            ),
            // stop strings, cut inside a verified draft
            9 => GenerateRequest {
                stop: vec![".".into(), " the".into()],
                ..request(p, SamplingParams::greedy())
            },
            _ => request(p, SamplingParams::greedy()),
        })
        .collect()
}

fn plain() -> &'static [Completion] {
    static P: OnceLock<Vec<Completion>> = OnceLock::new();
    P.get_or_init(|| {
        let e = start(None);
        let out = lamina_tests::run_all(&e, &requests());
        e.shutdown();
        out
    })
}

/// Log-probabilities of the same tokens: the same alternatives, values
/// within float rounding (a verify row's logits come from a multi-row
/// segment, whose products may round differently in the last bits).
fn assert_same_logprobs(a: &[(f32, Vec<(u32, f32)>)], b: &[(f32, Vec<(u32, f32)>)], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    let near = |x: f32, y: f32| (x - y).abs() <= 1e-3 * (1.0 + x.abs());
    for (j, ((x, xs), (y, ys))) in a.iter().zip(b).enumerate() {
        assert!(near(*x, *y), "{what}: token {j}: {x} vs {y}");
        assert_eq!(xs.len(), ys.len(), "{what}: token {j}");
        for ((u, p), (v, q)) in xs.iter().zip(ys) {
            assert!(
                u == v && near(*p, *q),
                "{what}: token {j}: {xs:?} vs {ys:?}"
            );
        }
    }
}

fn assert_same(want: &[Completion], got: &[Completion], what: &str) {
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert_eq!(a.error, None, "{what}: request {i}");
        assert_eq!(a.tokens, b.tokens, "{what}: request {i}: {:?}", b.error);
        assert_eq!(a.reason, b.reason, "{what}: request {i}");
        assert_eq!(a.text, b.text, "{what}: request {i}");
        assert_same_logprobs(&a.logprobs, &b.logprobs, &format!("{what}: request {i}"));
    }
}

#[test]
fn ngram_and_suffix_drafts_change_no_output_batched_and_alone() {
    let reqs = requests();
    let want = plain();
    for method in [SpecMethod::Ngram, SpecMethod::Suffix] {
        let e = start(Some(method.clone()));
        let got = lamina_tests::run_all(&e, &reqs);
        assert_same(want, &got, &format!("{method:?} batched"));
        // a few alone (one sequence per step)
        for i in [0, 3, 16, 19, 28] {
            let alone = lamina_tests::run_all(&e, std::slice::from_ref(&reqs[i]));
            assert_same(&want[i..=i], &alone, &format!("{method:?} alone {i}"));
        }
        let st = e.stats();
        assert!(
            st.spec_accepted_total > st.spec_verifies_total / 4,
            "{method:?}: few drafts accepted: {st:?}"
        );
        if method == SpecMethod::Suffix {
            // the replayed prompts draft their first run's output
            let before = e.stats();
            let again = lamina_tests::run_all(&e, &reqs[..10]);
            assert_same(&want[..10], &again, "suffix replayed");
            let after = e.stats();
            let drafted = after.spec_drafted_total - before.spec_drafted_total;
            let accepted = after.spec_accepted_total - before.spec_accepted_total;
            assert!(
                drafted > 0 && accepted * 10 >= drafted * 8,
                "replayed: {accepted} of {drafted} drafts accepted"
            );
        }
        e.shutdown();
    }
}

#[test]
fn a_draft_model_changes_no_output_and_drafts_itself_right() {
    let reqs = &requests()[..20];
    let want = &plain()[..20];
    let (draft, _) = smollm2_backend();
    let method = SpecMethod::Draft(DraftModel::loaded("smollm2", Box::new(draft)));
    let e = start(Some(method));
    let got = lamina_tests::run_all(&e, reqs);
    assert_same(want, &got, "draft batched");
    let before = e.stats();
    // greedy ones alone: the draft model's greedy tokens are the target's
    for i in [0, 4, 11, 17] {
        let alone = lamina_tests::run_all(&e, std::slice::from_ref(&reqs[i]));
        assert_same(&want[i..=i], &alone, &format!("draft alone {i}"));
    }
    let after = e.stats();
    let drafted = after.spec_drafted_total - before.spec_drafted_total;
    let accepted = after.spec_accepted_total - before.spec_accepted_total;
    assert!(
        drafted > 20 && accepted * 10 > drafted * 9,
        "alone: {accepted} of {drafted} drafts accepted"
    );
    e.shutdown();
}

/// Several sequences drafting in one call (one batched draft step per
/// drafted position) get the drafts each gets alone, at the first
/// proposal and after a partly rejected one.
#[test]
fn draft_model_sequences_drafting_together_draft_what_each_drafts_alone() {
    let mut together = DraftModelDrafter::new(Box::new(smollm2_backend().0)).expect("drafter");
    let mut alone = DraftModelDrafter::new(Box::new(smollm2_backend().0)).expect("drafter");
    let mut seqs: Vec<Vec<u32>> = prompts().into_iter().step_by(7).take(5).collect();
    let maxes = [5, 3, 6, 1, 4];
    for round in 0..3 {
        let reqs: Vec<Proposal<'_>> = seqs
            .iter()
            .zip(maxes)
            .enumerate()
            .map(|(i, (t, max))| Proposal {
                seq: i as u64,
                tokens: t,
                max,
            })
            .collect();
        let mut got = vec![Vec::new(); reqs.len()];
        together.propose_all(&reqs, &mut got);
        for (r, g) in reqs.iter().zip(&got) {
            let mut want = Vec::new();
            alone.propose(r.seq, r.tokens, r.max, &mut want);
            assert_eq!(g, &want, "round {round}, sequence {}", r.seq);
            assert_eq!(g.len(), r.max, "round {round}, sequence {}", r.seq);
        }
        // verification: half of each draft accepted, then another token
        for (t, d) in seqs.iter_mut().zip(&got) {
            let keep = d.len() / 2;
            t.extend_from_slice(&d[..keep]);
            t.push(d.get(keep).map_or(13, |x| (x + 1) % 1000));
        }
    }
}

/// A JSON object with one string field, and printable text.
fn constrained_requests() -> Vec<(GenerateRequest, Option<serde_json::Value>)> {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    });
    TEXTS
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let (task, constraint) = match i % 2 {
                0 => (
                    "Reply in JSON with the field text holding this text exactly:",
                    Constraint::JsonSchema(schema.clone()),
                ),
                _ => (
                    "Repeat this text exactly:",
                    Constraint::Regex("[ -~]{8,200}".into()),
                ),
            };
            let prompt = lamina_tests::smollm2()
                .tok
                .encode_chat(&[ChatMessage::new("user", format!("{task}\n{text}"))])
                .expect("chat template");
            let r = GenerateRequest {
                constraint: Some(constraint),
                max_tokens: 40,
                ..request(prompt, SamplingParams::greedy())
            };
            (r, (i % 2 == 0).then(|| schema.clone()))
        })
        .collect()
}

#[test]
fn constrained_greedy_outputs_with_ngram_and_suffix_drafts_are_plain_decodings() {
    let cases = constrained_requests();
    let reqs: Vec<GenerateRequest> = cases.iter().map(|(r, _)| r.clone()).collect();
    let e = start(None);
    let want = lamina_tests::run_all(&e, &reqs);
    e.shutdown();
    let mut complete = 0;
    for (i, (out, (_, schema))) in want.iter().zip(&cases).enumerate() {
        assert_eq!(out.error, None, "request {i}");
        if out.reason != FinishReason::Stop {
            continue;
        }
        complete += 1;
        match schema {
            Some(_) => {
                let v: serde_json::Value = serde_json::from_str(&out.text)
                    .unwrap_or_else(|e| panic!("request {i}: {e}: {:?}", out.text));
                assert!(v["text"].is_string(), "request {i}: {v}");
            }
            None => assert!(
                out.text.chars().all(|c| (' '..='~').contains(&c)),
                "request {i}: {:?}",
                out.text
            ),
        }
    }
    assert!(complete >= 3, "only {complete} outputs complete");
    for method in [SpecMethod::Ngram, SpecMethod::Suffix] {
        let e = start(Some(method.clone()));
        let got = lamina_tests::run_all(&e, &reqs);
        assert_same(&want, &got, &format!("{method:?} constrained batched"));
        for i in [0, 1, 4] {
            let alone = lamina_tests::run_all(&e, std::slice::from_ref(&reqs[i]));
            assert_same(
                &want[i..=i],
                &alone,
                &format!("{method:?} constrained alone {i}"),
            );
        }
        let st = e.stats();
        assert!(
            st.spec_verifies_total > 0 && st.spec_accepted_total * 4 > st.spec_drafted_total,
            "{method:?}: constrained requests drafted little: {st:?}"
        );
        e.shutdown();
    }
}
