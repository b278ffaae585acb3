//! Several models behind one server in process: routing by `model`, the
//! models' states in `/v1/models` and `/models`, loads on demand with
//! LRU eviction, a load that does not fit, unloading, names refused at
//! registration, and `/metrics` with one family header for all models.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use server::{AppState, LoadError, Models, Policy, Registration, Served, ServerConfig};

use super::*;

/// A model over a fresh fake engine.
fn served() -> Served {
    let (engine, tok) = fake::engine(fake::Setup::default());
    Served::new(server::Replicas::single(engine), tok)
}

/// An app of models `names`, the first `preloaded` loaded at start, each
/// loadable again; the loads counted per model.
fn app_models(names: &[&str], preloaded: usize, policy: Policy) -> (App, Arc<Vec<AtomicUsize>>) {
    let loads: Arc<Vec<AtomicUsize>> =
        Arc::new(names.iter().map(|_| AtomicUsize::new(0)).collect());
    let list = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let counts = loads.clone();
            Registration {
                name: n.to_string(),
                owned_by: "tests".into(),
                served: (i < preloaded).then(served),
                loader: Some(Arc::new(move || {
                    counts[i].fetch_add(1, Ordering::SeqCst);
                    Ok(served())
                })),
            }
        })
        .collect();
    let models = Models::new(policy, list).expect("models");
    let state = AppState::with_models(models, ServerConfig::new(names[0]));
    let app = App {
        router: server::router(state.clone()),
        state,
    };
    (app, loads)
}

fn chat(model: &str) -> Value {
    json!({"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
}

async fn state_of(app: &App, model: &str) -> String {
    let v = app.get("/models").await.json();
    let m = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == model)
        .cloned();
    m.unwrap_or_else(|| panic!("{model} not in {v}"))["status"]["value"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn wait_state(app: &App, model: &str, want: &str) {
    let t0 = Instant::now();
    while state_of(app, model).await != want {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{model} never {want}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn requests_go_to_the_model_they_name() {
    let (app, loads) = app_models(&["one", "two"], 2, Policy::default());
    for m in ["one", "two"] {
        let r = app.post_json("/v1/chat/completions", &chat(m)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["model"], m);
    }
    // no `model`: the first
    let r = app
        .post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}))
        .await;
    assert_eq!(r.json()["model"], "one");
    let v = app.get("/v1/models").await.json();
    assert_eq!(v["data"][1]["id"], "two");
    assert_eq!(v["data"][1]["owned_by"], "tests");
    assert_eq!(v["data"][1]["status"]["value"], "loaded");
    let r = app.post_json("/v1/chat/completions", &chat("three")).await;
    let v = r.assert_error(404, Some("model"));
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("`three`") && msg.contains("`one`, `two`"),
        "{msg}"
    );
    let text = app.get("/metrics").await.text();
    assert_eq!(
        text.matches("# HELP lamina_time_to_first_token_seconds ")
            .count(),
        1,
        "{text}"
    );
    // each model's requests in its own series: two on `one`, one on `two`
    for (m, n) in [("one", 2), ("two", 1)] {
        let count = format!("lamina_time_to_first_token_seconds_count{{model_name=\"{m}\"}} {n}\n");
        assert!(text.contains(&count), "{count} in {text}");
        assert!(text.contains(&format!("lamina_model_loaded{{model_name=\"{m}\"}} 1")));
    }
    assert_eq!(
        loads[0].load(Ordering::SeqCst),
        0,
        "preloaded, never loaded again"
    );
}

#[tokio::test]
async fn past_the_cap_the_least_recently_used_idle_model_is_evicted() {
    let policy = Policy {
        max_loaded: 1,
        ..Policy::default()
    };
    let (app, loads) = app_models(&["one", "two"], 1, policy);
    assert_eq!(state_of(&app, "two").await, "unloaded");
    let r = app.post_json("/v1/chat/completions", &chat("two")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_state(&app, "one", "unloaded").await;
    assert_eq!(state_of(&app, "two").await, "loaded");
    assert_eq!(loads[1].load(Ordering::SeqCst), 1);
    let r = app.post_json("/v1/chat/completions", &chat("one")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_state(&app, "two", "unloaded").await;
    assert_eq!(loads[0].load(Ordering::SeqCst), 1);
    // an explicit unload, then a load
    let r = app
        .post_json("/models/unload", &json!({"model": "one"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_state(&app, "one", "unloaded").await;
    let r = app
        .post_json("/models/load", &json!({"model": "one"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(state_of(&app, "one").await, "loaded");
    let r = app
        .post_json("/models/unload", &json!({"model": "nine"}))
        .await;
    r.assert_error(404, Some("model"));
}

#[tokio::test]
async fn a_load_that_does_not_fit_names_the_memory_needed_and_free() {
    let list = vec![
        Registration {
            name: "small".into(),
            owned_by: "tests".into(),
            served: Some(served()),
            loader: None,
        },
        Registration {
            name: "huge".into(),
            owned_by: "tests".into(),
            served: None,
            loader: Some(Arc::new(|| {
                Err(LoadError::DoesNotFit {
                    model: "huge".into(),
                    where_: "host",
                    needed: 3 << 30,
                    free: 1 << 30,
                    hint: String::new(),
                })
            })),
        },
    ];
    let models = Models::new(Policy::default(), list).unwrap();
    let state = AppState::with_models(models, ServerConfig::new("small"));
    let app = App {
        router: server::router(state.clone()),
        state,
    };
    let r = app.post_json("/v1/chat/completions", &chat("huge")).await;
    assert_eq!(r.status.as_u16(), 507, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("`huge`") && msg.contains("3072 MiB") && msg.contains("1024 MiB"),
        "{msg}"
    );
    assert_eq!(state_of(&app, "huge").await, "unloaded");
    // a model with no loader cannot be unloaded
    let r = app
        .post_json("/models/unload", &json!({"model": "small"}))
        .await;
    assert_eq!(r.status.as_u16(), 409, "{}", r.text());
    assert!(
        app.post_json("/v1/chat/completions", &chat("small"))
            .await
            .status
            == 200
    );
}

#[test]
fn a_name_given_twice_is_refused_by_name() {
    let twice = |name: &str| Registration {
        name: name.into(),
        owned_by: "tests".into(),
        served: Some(served()),
        loader: None,
    };
    let err = Models::new(Policy::default(), vec![twice("same"), twice("same")])
        .err()
        .expect("refused");
    assert!(err.contains("`same`") && err.contains("taken"), "{err}");
}
