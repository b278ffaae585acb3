//! The Responses API store as clients of several API keys see it: a stored
//! response is its key's alone, ids are random, `metadata` keeps OpenAI's
//! limits, and a response too large to keep says so.

use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};

use crate::{LETTERS, MODEL, app, app_with, fake};

fn resp(extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "input": "hi", "max_output_tokens": 8});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    b
}

/// `method path` with `key`, and a JSON body unless `None`.
fn keyed(method: &str, path: &str, key: &str, body: Option<&Value>) -> Request<Body> {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json");
    let body = body.map_or(Body::empty(), |b| Body::from(b.to_string()));
    req.body(body).expect("request")
}

fn is_random_id(id: &str) -> bool {
    id.strip_prefix("resp_").is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[tokio::test]
async fn a_stored_response_is_readable_only_with_the_key_that_made_it() {
    let app = app_with(fake::Setup::default(), |c| {
        c.api_keys = vec!["k1".into(), "k2".into()]
    });
    let r = app
        .send(keyed("POST", "/v1/responses", "k1", Some(&resp(json!({})))))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    assert!(is_random_id(&id), "{id}");
    let path = format!("/v1/responses/{id}");
    // another key: as if it had never been stored
    let r = app.send(keyed("GET", &path, "k2", None)).await;
    r.assert_error(404, None);
    assert!(!r.text().contains(LETTERS), "{}", r.text());
    let cont = resp(json!({"previous_response_id": id}));
    let r = app
        .send(keyed("POST", "/v1/responses", "k2", Some(&cont)))
        .await;
    r.assert_error(400, Some("previous_response_id"));
    app.send(keyed("DELETE", &path, "k2", None))
        .await
        .assert_error(404, None);
    // its own key: all there
    let r = app.send(keyed("GET", &path, "k1", None)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = app
        .send(keyed("POST", "/v1/responses", "k1", Some(&cont)))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let next = r.json()["id"].as_str().unwrap().to_string();
    assert!(is_random_id(&next) && next != id, "{next}");
    let r = app.send(keyed("DELETE", &path, "k1", None)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    app.wait_idle().await;
}

#[tokio::test]
async fn metadata_past_openais_limits_is_refused_naming_it() {
    let app = app();
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    let long_key = json!({"SECRET".repeat(11): "v"});
    let long_value = json!({"k": "SECRET".repeat(86)});
    for (metadata, needle) in [
        (Value::Object(many), "16"),
        (long_key, "64"),
        (long_value, "512"),
    ] {
        let r = app
            .post_json("/v1/responses", &resp(json!({"metadata": metadata})))
            .await;
        let v = r.assert_error(400, Some("metadata"));
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(needle) && !m.contains("SECRET"), "{m}");
    }
    // at the limits: accepted
    let full: serde_json::Map<String, Value> = (0..16)
        .map(|i| (format!("{i:0>64}"), json!("v".repeat(512))))
        .collect();
    let r = app
        .post_json("/v1/responses", &resp(json!({"metadata": full})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    app.wait_idle().await;
}

#[tokio::test]
async fn a_response_too_large_to_store_says_it_was_not_stored() {
    let app = app_with(fake::Setup::default(), |c| c.responses_store_bytes = 300);
    let r = app.post_json("/v1/responses", &resp(json!({}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["store"], false, "{v}");
    let id = v["id"].as_str().unwrap();
    app.get(&format!("/v1/responses/{id}"))
        .await
        .assert_error(404, None);
    assert_eq!(app.state.responses.usage().0, 0);
    app.wait_idle().await;
}
