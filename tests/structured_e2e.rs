//! Constrained decoding on the CPU backend with SmolLM2: 20 JSON
//! schemas of varied shape (nested objects, arrays, enums, bounded numbers,
//! optional fields, `additionalProperties: false`) each give output that
//! parses and validates against its schema (checked by the `jsonschema`
//! crate), greedy and seeded, batched together with unconstrained requests
//! whose output equals what they produce alone; regex and Lark constraints
//! match; bad schemas and grammars are refused at submit naming the reason;
//! preempted constrained requests give exactly what they give alone.
//!
//! Costs: SmolLM2 (270 MB) is loaded once (fetched through the store on
//! first use); outputs are short (`max_tokens` 64), so the test takes well
//! under a minute on 2 cores in release.

use std::sync::OnceLock;

use contract::{KvShape, SamplingParams};
use engine::{
    Completion, Constraint, Engine, EngineConfig, FinishReason, GenerateRequest, SubmitError,
};
use serde_json::{Value, json};
use tokenizer::ChatMessage;

const MAX_TOKENS: usize = 64;

fn start(max_num_seqs: usize) -> Engine {
    start_with(max_num_seqs, 256)
}

fn start_with(max_num_seqs: usize, num_blocks: usize) -> Engine {
    let m = lamina_tests::smollm2();
    let loaded = checkpoint::loader::load_config(&m.dir).expect("config");
    let weights = checkpoint::loader::load_weights(&m.dir, &loaded.config).expect("weights");
    let kv = KvShape {
        num_blocks,
        block_size: 16,
    };
    let backend = model::cpu::CpuBackend::with_path(
        loaded.config.clone(),
        weights,
        kv,
        model::cpu::CpuPath::Fast,
    )
    .expect("cpu backend");
    Engine::start(
        Box::new(backend),
        m.tok.clone(),
        loaded.eos_ids.clone(),
        EngineConfig {
            max_num_seqs,
            max_batch_tokens: 2048,
            ..EngineConfig::default()
        },
    )
    .expect("engine")
}

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| start(32))
}

fn chat(text: &str) -> Vec<u32> {
    lamina_tests::smollm2()
        .tok
        .encode_chat(&[ChatMessage::new("user", text)])
        .expect("chat template")
}

fn request(prompt: Vec<u32>, sampling: SamplingParams, c: Option<Constraint>) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling,
        max_tokens: MAX_TOKENS,
        stop: Vec::new(),
        ignore_eos: false,
        stop_token_ids: Vec::new(),
        constraint: c,
        speculative: true,
        lora: None,
    }
}

/// Twenty schemas of varied shape, each with a prompt that asks for it.
fn schemas() -> Vec<(&'static str, Value)> {
    let s = |max: usize| json!({"type": "string", "maxLength": max});
    vec![
        (
            "a person",
            json!({"type": "object", "properties": {"name": s(12), "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                   "required": ["name", "age"], "additionalProperties": false}),
        ),
        (
            "a color",
            json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                   "required": ["color"], "additionalProperties": false}),
        ),
        (
            "three small numbers",
            json!({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 3, "maxItems": 3}),
        ),
        ("a yes or no answer", json!({"type": "boolean"})),
        ("a city name", s(16)),
        (
            "a point",
            json!({"type": "object", "properties": {"x": {"type": "integer", "minimum": -50, "maximum": 50},
                   "y": {"type": "integer", "minimum": -50, "maximum": 50}}, "required": ["x", "y"], "additionalProperties": false}),
        ),
        (
            "a book with an author",
            json!({"type": "object", "properties": {"title": s(20), "author": {"type": "object",
                   "properties": {"first": s(10), "last": s(10)}, "required": ["first", "last"], "additionalProperties": false}},
                   "required": ["title", "author"], "additionalProperties": false}),
        ),
        (
            "a list of up to three fruits",
            json!({"type": "array", "items": {"enum": ["apple", "pear", "plum", "fig"]}, "maxItems": 3}),
        ),
        (
            "a percentage",
            json!({"type": "object", "properties": {"percent": {"type": "integer", "minimum": 0, "maximum": 100}},
                   "required": ["percent"], "additionalProperties": false}),
        ),
        (
            "a user with an optional email",
            json!({"type": "object", "properties": {"user": s(10), "email": s(20)}, "required": ["user"], "additionalProperties": false}),
        ),
        (
            "a weather report",
            json!({"type": "object", "properties": {"city": s(12), "sky": {"enum": ["sunny", "cloudy", "rainy"]},
                   "celsius": {"type": "integer", "minimum": -40, "maximum": 50}}, "required": ["city", "sky", "celsius"], "additionalProperties": false}),
        ),
        (
            "a matrix of two rows of two digits",
            json!({"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2},
                   "minItems": 2, "maxItems": 2}),
        ),
        (
            "a task with a priority",
            json!({"type": "object", "properties": {"task": s(16), "priority": {"enum": [1, 2, 3]}, "done": {"type": "boolean"}},
                   "required": ["task", "priority", "done"], "additionalProperties": false}),
        ),
        ("null", json!({"type": "null"})),
        (
            "a score between 0 and 1",
            json!({"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
                   "required": ["score"], "additionalProperties": false}),
        ),
        (
            "an order with items",
            json!({"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                   "items": {"type": "array", "items": {"type": "object", "properties": {"sku": s(6), "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                   "required": ["sku", "qty"], "additionalProperties": false}, "maxItems": 2}}, "required": ["id", "items"], "additionalProperties": false}),
        ),
        (
            "a status code",
            json!({"type": "object", "properties": {"code": {"type": "integer", "enum": [200, 404, 500]}, "ok": {"type": "boolean"}},
                   "required": ["code"], "additionalProperties": false}),
        ),
        (
            "a word and its length",
            json!({"type": "object", "properties": {"word": {"type": "string", "minLength": 1, "maxLength": 10}, "len": {"type": "integer", "minimum": 1, "maximum": 10}},
                   "required": ["word", "len"]}),
        ),
        (
            "either a number or a short text",
            json!({"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, s(8)]}),
        ),
        (
            "a tagged note",
            json!({"type": "object", "properties": {"note": s(16), "tags": {"type": "array", "items": s(8), "maxItems": 2}},
                   "required": ["note", "tags"], "additionalProperties": false}),
        ),
    ]
}

fn prompt_for(what: &str) -> Vec<u32> {
    chat(&format!("Reply with JSON only: {what}."))
}

fn run_all(engine: &Engine, reqs: Vec<GenerateRequest>) -> Vec<Completion> {
    let handles: Vec<_> = reqs
        .into_iter()
        .map(|r| engine.submit(r).expect("submit"))
        .collect();
    handles.into_iter().map(|h| h.blocking_collect()).collect()
}

fn check_valid(what: &str, schema: &Value, out: &Completion) {
    assert_eq!(
        out.reason,
        FinishReason::Stop,
        "{what}: ended {:?} ({:?}) after {:?}",
        out.reason,
        out.error,
        out.text
    );
    let v: Value = serde_json::from_str(&out.text)
        .unwrap_or_else(|e| panic!("{what}: output {:?} is not JSON: {e}", out.text));
    let validator = jsonschema::validator_for(schema).expect("a valid schema");
    if let Err(e) = validator.validate(&v) {
        panic!("{what}: {v} does not match {schema}: {e}");
    }
}

fn unconstrained() -> Vec<GenerateRequest> {
    ["Name a fruit.", "Count to five."]
        .into_iter()
        .map(|t| request(chat(t), SamplingParams::greedy(), None))
        .collect()
}

#[test]
fn twenty_schemas_batched_with_free_requests_validate_and_leave_them_unchanged() {
    let e = engine();
    let free = unconstrained();
    let alone: Vec<Vec<u32>> = free
        .iter()
        .map(|r| run_all(e, vec![r.clone()]).remove(0).tokens)
        .collect();
    let schemas = schemas();
    let mut reqs: Vec<GenerateRequest> = Vec::new();
    // unconstrained first, in the middle and last of the batch
    reqs.push(free[0].clone());
    for (i, (what, schema)) in schemas.iter().enumerate() {
        let sampling = if i % 2 == 0 {
            SamplingParams::greedy()
        } else {
            SamplingParams {
                temperature: 0.8,
                seed: 1000 + i as u64,
                ..SamplingParams::default()
            }
        };
        reqs.push(request(
            prompt_for(what),
            sampling,
            Some(Constraint::JsonSchema(schema.clone())),
        ));
        if i == schemas.len() / 2 {
            reqs.push(free[1].clone());
        }
    }
    let n = reqs.len();
    let outs = run_all(e, reqs.clone());
    assert_eq!(outs[0].tokens, alone[0], "unconstrained request changed");
    let mid = schemas.len() / 2 + 2;
    assert_eq!(outs[mid].tokens, alone[1], "unconstrained request changed");
    let constrained: Vec<&Completion> = outs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 0 && *i != mid)
        .map(|(_, c)| c)
        .collect();
    assert_eq!(constrained.len(), schemas.len());
    for ((what, schema), out) in schemas.iter().zip(&constrained) {
        check_valid(what, schema, out);
    }
    // seeded and greedy requests are reproducible however they are batched:
    // the constrained ones again, one at a time
    for (k, (i, r)) in reqs
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 0 && *i != mid)
        .enumerate()
        .filter(|(k, _)| k % 5 == 1)
    {
        let again = run_all(e, vec![r]).remove(0);
        assert_eq!(again.tokens, outs[i].tokens, "schema {k} alone differs");
    }
    assert!(n > 20);
}

#[test]
fn json_object_regex_and_lark_constraints_match() {
    let e = engine();
    let reqs = vec![
        request(
            prompt_for("an object describing a dog"),
            SamplingParams::greedy(),
            Some(Constraint::JsonObject),
        ),
        request(
            chat("What is the date of the moon landing?"),
            SamplingParams::greedy(),
            Some(Constraint::Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}".into())),
        ),
        request(
            chat("Is the sky green?"),
            SamplingParams::greedy(),
            Some(Constraint::Lark(
                r#"start: answer "." 
answer: "yes" | "no""#
                    .into(),
            )),
        ),
    ];
    let outs = run_all(e, reqs);
    // any object is allowed, so a long one may be cut by max_tokens
    match outs[0].reason {
        FinishReason::Stop => {
            let obj: Value = serde_json::from_str(&outs[0].text)
                .unwrap_or_else(|err| panic!("json_object gave {:?}: {err}", outs[0].text));
            assert!(obj.is_object(), "{obj}");
        }
        r => {
            assert_eq!(r, FinishReason::Length, "{:?}", outs[0].error);
            assert!(outs[0].text.starts_with('{'), "{:?}", outs[0].text);
        }
    }
    let date = &outs[1].text;
    assert_eq!(outs[1].reason, FinishReason::Stop);
    assert!(
        date.len() == 10
            && date.chars().enumerate().all(|(i, c)| if i == 4 || i == 7 {
                c == '-'
            } else {
                c.is_ascii_digit()
            }),
        "{date:?}"
    );
    assert!(
        outs[2].text == "yes." || outs[2].text == "no.",
        "{:?}",
        outs[2].text
    );
}

#[test]
fn bad_constraints_are_refused_naming_the_reason_and_the_engine_goes_on() {
    let e = engine();
    let cases = [
        (
            Constraint::JsonSchema(
                json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
            ),
            "missing",
        ),
        (
            Constraint::JsonSchema(json!({"type": "frobnicate"})),
            "frobnicate",
        ),
        (Constraint::Regex("[a-".into()), "regex"),
        (
            Constraint::Lark("start: undefined_rule".into()),
            "undefined_rule",
        ),
    ];
    for (c, needle) in cases {
        let kind = c.kind();
        let err = e
            .submit(request(chat("hi"), SamplingParams::greedy(), Some(c)))
            .err()
            .unwrap_or_else(|| panic!("{kind} with {needle} was accepted"));
        let SubmitError::Grammar(g) = &err else {
            panic!("{kind}: unexpected error {err}");
        };
        let text = err.to_string();
        assert_eq!(g.kind, kind);
        assert!(
            text.contains(needle) || text.contains(kind),
            "{kind}: {text:?} does not name {needle}"
        );
    }
    // the engine still serves
    let out = run_all(
        e,
        vec![request(chat("Say hi."), SamplingParams::greedy(), None)],
    )
    .remove(0);
    assert!(!out.tokens.is_empty());
}

#[test]
fn a_constrained_request_cut_by_max_tokens_ends_with_length() {
    let e = engine();
    let mut r = request(
        prompt_for("a long list of numbers"),
        SamplingParams::greedy(),
        Some(Constraint::JsonSchema(
            json!({"type": "array", "items": {"type": "integer"}, "minItems": 50}),
        )),
    );
    r.max_tokens = 8;
    let out = run_all(e, vec![r]).remove(0);
    assert_eq!(out.reason, FinishReason::Length, "{:?}", out.error);
    assert_eq!(out.tokens.len(), 8);
    assert!(out.text.starts_with('['), "{:?}", out.text);
}

#[test]
fn preempted_constrained_requests_give_what_they_give_alone() {
    // a pool too small for the batch as it grows: sequences are preempted
    // and recomputed, their grammar state kept
    let small = start_with(16, 10);
    let reqs: Vec<GenerateRequest> = schemas()
        .into_iter()
        .take(8)
        .map(|(what, schema)| {
            request(
                prompt_for(what),
                SamplingParams::greedy(),
                Some(Constraint::JsonSchema(schema)),
            )
        })
        .collect();
    let outs = run_all(&small, reqs.clone());
    assert!(
        small.stats().preemptions_total > 0,
        "no preemption: {:?}",
        small.stats()
    );
    small.shutdown();
    for (i, (r, out)) in reqs.into_iter().zip(&outs).enumerate() {
        let alone = run_all(engine(), vec![r]).remove(0);
        assert_eq!(
            out.tokens, alone.tokens,
            "request {i} changed under preemption"
        );
    }
}
