//! Fuzzing the request parsing of `/v1/chat/completions`,
//! `/v1/completions`, `/tokenize`, Anthropic's `/v1/messages` and the
//! Responses API's `/v1/responses` through the whole router: the seed
//! bodies of `tests/fuzz-corpus/http` (`chat-*`, `completion-*`,
//! `tokenize-*`, `messages-*`, `responses-*`, each posted to its route) with
//! fields removed or replaced by arbitrary JSON, as mutated bytes under odd
//! content types, and random bytes.
//!
//! Property: no panic and no 5xx; every refusal is an error object with a
//! message under `error` (OpenAI's shape, or Anthropic's on `/v1/messages`)
//! and a non-empty `param` when one is given; every success is a JSON
//! reply or an SSE stream ending as its API ends one (one `[DONE]`,
//! `message_stop`, `response.completed` / `response.incomplete`) with no
//! error event; afterwards the engine is idle (no request leaked).
//! `LAMINA_FUZZ_CASES` sets the number of cases.

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::Request;
use proptest::prelude::*;
use serde_json::Value;

use crate::{App, Reply, app, sse_chunks, sse_data};

/// One app and runtime for all cases (an engine start per case would
/// dominate the run).
fn shared() -> &'static (tokio::runtime::Runtime, App) {
    static APP: OnceLock<(tokio::runtime::Runtime, App)> = OnceLock::new();
    APP.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let app = rt.block_on(async { app() });
        (rt, app)
    })
}

fn route(seed_name: &str) -> &'static str {
    match seed_name.split('-').next() {
        Some("chat") => "/v1/chat/completions",
        Some("completion") => "/v1/completions",
        Some("tokenize") => "/tokenize",
        Some("messages") => "/v1/messages",
        Some("responses") => "/v1/responses",
        _ => panic!(
            "seed {seed_name}: name must start with chat-, completion-, tokenize-, messages- or responses-"
        ),
    }
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    fuzzkit::corpus("http")
        .into_iter()
        .map(|(name, b)| (route(&name), b))
        .collect()
}

fn json_seeds() -> Vec<(&'static str, Value)> {
    seeds()
        .into_iter()
        .map(|(r, b)| (r, serde_json::from_slice(&b).expect("seed JSON")))
        .collect()
}

/// Posts `body` to `path` and checks the reply contract.
fn request_input(path: &str, content_type: Option<&str>, body: Vec<u8>) {
    let (rt, app) = shared();
    let mut req = Request::post(path);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let req = req.body(Body::from(body)).expect("request");
    let reply: Reply = rt.block_on(app.send(req));
    let status = reply.status.as_u16();
    assert!(status < 500, "{path}: {status}: {}", reply.text());
    if status >= 400 {
        let v = reply.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        if let Some(p) = e.get("param").filter(|p| !p.is_null()) {
            assert!(p.as_str().is_some_and(|p| !p.is_empty()), "{v}");
        }
        return;
    }
    let sse = reply
        .headers
        .get("content-type")
        .is_some_and(|c| c.as_bytes().starts_with(b"text/event-stream"));
    if sse {
        let text = reply.text();
        let last_event = |data: Vec<String>| -> Value {
            let events: Vec<Value> = data
                .iter()
                .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{d:?}: {e}")))
                .collect();
            for e in &events {
                assert!(e["type"] != "error", "{text}");
            }
            events.last().cloned().unwrap_or(Value::Null)
        };
        match path {
            "/v1/messages" => {
                assert_eq!(
                    last_event(sse_data(&text))["type"],
                    "message_stop",
                    "{text}"
                );
            }
            "/v1/responses" => {
                let kind = last_event(sse_data(&text))["type"].clone();
                assert!(
                    kind == "response.completed" || kind == "response.incomplete",
                    "{text}"
                );
            }
            _ => {
                for chunk in sse_chunks(&text) {
                    assert!(chunk.get("error").is_none(), "{chunk}");
                }
            }
        }
    } else {
        // a Responses object carries `"error": null`
        let v = reply.json();
        assert!(v.get("error").is_none_or(Value::is_null), "{v}");
    }
}

fn content_type() -> impl Strategy<Value = Option<&'static str>> {
    proptest::sample::select(vec![
        Some("application/json"),
        Some("text/plain"),
        Some("application/json; charset=latin1"),
        Some("multipart/form-data; boundary=x"),
        None,
    ])
}

proptest! {
    #![proptest_config(fuzzkit::config(fuzzkit::DEFAULT_CASES))]

    #[test]
    fn requests_with_mutated_fields(
        (path, v) in proptest::sample::select(json_seeds())
            .prop_flat_map(|(p, v)| (Just(p), fuzzkit::mutated_json(v)))
    ) {
        request_input(path, Some("application/json"), v.to_string().into_bytes());
    }

    #[test]
    fn requests_as_mutated_bytes(
        (path, b) in proptest::sample::select(seeds())
            .prop_flat_map(|(p, b)| (Just(p), fuzzkit::mutated(b))),
        ct in content_type(),
    ) {
        request_input(path, ct, b);
    }

    #[test]
    fn requests_of_random_bytes(
        path in proptest::sample::select(vec![
            "/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/messages", "/v1/responses",
        ]),
        b in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        request_input(path, Some("application/json"), b);
    }
}

#[test]
fn every_seed_is_served() {
    for (path, b) in seeds() {
        let (rt, app) = shared();
        let reply = rt.block_on(app.send(crate::post(path, b)));
        assert_eq!(reply.status.as_u16(), 200, "{path}: {}", reply.text());
    }
}

#[test]
fn fuzzed_requests_leave_the_engine_idle() {
    for (path, v) in json_seeds() {
        let mut v = v;
        v["ignore_eos"] = Value::Bool(true);
        request_input(path, None, v.to_string().into_bytes());
    }
    let (rt, app) = shared();
    rt.block_on(app.wait_idle());
}

/// Small limits, so generated structures cross them often.
fn small_limits() -> server::InputLimits {
    server::InputLimits {
        schema_nodes: 200,
        schema_depth: 6,
        grammar_rules: 40,
        pattern_depth: 8,
        tools: 8,
        ..server::InputLimits::default()
    }
}

/// An app with [`small_limits`] and its runtime, shared by the cases.
fn limited() -> &'static (tokio::runtime::Runtime, App) {
    static APP: OnceLock<(tokio::runtime::Runtime, App)> = OnceLock::new();
    APP.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let app = rt.block_on(async {
            crate::app_with(crate::fake::Setup::default(), |c| c.limits = small_limits())
        });
        (rt, app)
    })
}

/// The longest the handler of one request may hold the thread polling it:
/// longer would stall every other connection served by that thread.
const MAX_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// A future with the wall time of its longest single poll, i.e. the
/// longest it kept the runtime's thread (work handed to other threads, like
/// the server's work pool, is waited for between polls and not counted).
struct Timed<F> {
    inner: std::pin::Pin<Box<F>>,
    longest: std::time::Duration,
}

impl<F: std::future::Future> std::future::Future for Timed<F> {
    type Output = (F::Output, std::time::Duration);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let t0 = std::time::Instant::now();
        let r = self.inner.as_mut().poll(cx);
        self.longest = self.longest.max(t0.elapsed());
        r.map(|v| (v, self.longest))
    }
}

fn timed<F: std::future::Future>(f: F) -> Timed<F> {
    Timed {
        inner: Box::pin(f),
        longest: std::time::Duration::ZERO,
    }
}

/// Posts a chat request with `extra` fields: no panic, a 200 or a 400 (an
/// error naming a parameter), and the runtime never held for more than
/// [`MAX_POLL`] by it.
fn limited_chat(extra: Value) {
    let (rt, app) = limited();
    let mut body = serde_json::json!({
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let (reply, longest) = rt.block_on(timed(app.post_json("/v1/chat/completions", &body)));
    let status = reply.status.as_u16();
    assert!(status == 200 || status == 400, "{status}: {}", reply.text());
    assert!(
        longest < MAX_POLL,
        "the request held the runtime for {longest:?} in one poll (limit {MAX_POLL:?}); \
         its work belongs on the work pool"
    );
    if status == 400 {
        let v = reply.json();
        let param = v["error"]["param"].as_str().unwrap_or_default().to_string();
        assert!(!param.is_empty(), "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.len() < 1_000),
            "{v}"
        );
    }
}

proptest! {
    #![proptest_config(fuzzkit::config(fuzzkit::DEFAULT_CASES / 4))]

    /// Schemas up to and past the limits (size and depth).
    #[test]
    fn schemas_around_the_limits(schema in fuzzkit::nested_schema(9, 6, 400)) {
        limited_chat(serde_json::json!({"response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}));
    }

    /// Lark grammars up to and past the rule and nesting limits.
    #[test]
    fn grammars_around_the_limits(g in fuzzkit::lark_grammar(80, 12)) {
        limited_chat(serde_json::json!({"guided_grammar": g}));
    }

    /// Tool lists up to and past the count and schema limits, in `auto`
    /// and `required` modes.
    #[test]
    fn tool_lists_around_the_limits(
        tools in fuzzkit::tool_list(12, 5, 4, 60),
        required in any::<bool>(),
    ) {
        let choice = if required { "required" } else { "auto" };
        limited_chat(serde_json::json!({"tools": tools, "tool_choice": choice}));
    }
}
