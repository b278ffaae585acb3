//! Data parallelism: several engines behind one server. Requests sharing a
//! prefix land on the replica that cached it, others spread by load, a
//! replica that fails is taken out of rotation while the others finish
//! what they accepted, a disconnect frees blocks on the replica that ran
//! the request, and metrics come per replica and summed.

use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use serde_json::json;
use tower::ServiceExt;

use super::fake::Setup;
use super::*;

fn slow(delay_ms: u64) -> Setup {
    Setup {
        delay: Duration::from_millis(delay_ms),
        halt_on_backend_error: true,
        ..Setup::default()
    }
}

/// The value of the sample line that starts with `series` (name and labels).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{series}` in\n{text}"))
}

fn engine_series(name: &str, engine: usize) -> String {
    format!("{name}{{model_name=\"{MODEL}\",engine=\"{engine}\"}}")
}

fn total_series(name: &str) -> String {
    format!("{name}{{model_name=\"{MODEL}\"}}")
}

#[tokio::test]
async fn shared_prefix_lands_on_the_replica_that_cached_it() {
    let app = app_replicas(vec![slow(0), slow(0)]);
    // 80 bytes of shared "system prompt": five full blocks of 16
    let system = "You are a helpful assistant. Answer briefly and never invent facts. Be kind. ";
    for i in 0..4 {
        let body = json!({"prompt": format!("{system}{i}a"), "max_tokens": 3});
        let r = app.post_json("/v1/completions", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    app.wait_idle().await;
    let m = app.get("/metrics").await.text();
    let routes = |e: usize, route: &str| {
        sample(
            &m,
            &format!(
                "lamina_router_requests_total{{model_name=\"{MODEL}\",engine=\"{e}\",route=\"{route}\"}}"
            ),
        )
    };
    // the first went by load (nothing cached anywhere), the others followed it
    let home = usize::from(routes(1, "load") == 1.0);
    assert_eq!(routes(home, "load"), 1.0, "{m}");
    assert_eq!(routes(home, "prefix"), 3.0, "{m}");
    assert_eq!(routes(1 - home, "load") + routes(1 - home, "prefix"), 0.0);
    // the replica's prefix cache served the shared blocks three times
    let hits = |e| sample(&m, &engine_series("lamina_prefix_cache_hits_total", e));
    assert!(hits(home) >= 3.0 * 64.0, "{m}");
    assert_eq!(hits(1 - home), 0.0);
    assert_eq!(
        sample(&m, &total_series("lamina_prefix_cache_hits_total")),
        hits(home)
    );
}

#[tokio::test]
async fn unrelated_requests_spread_by_load_and_metrics_sum() {
    let app = app_replicas(vec![slow(3), slow(3)]);
    let reqs = (0..8).map(|i| {
        let app = &app;
        async move {
            // short, distinct prompts: no full block to be affine to
            let body = json!({"prompt": format!("{i}a"), "max_tokens": 20});
            app.post_json("/v1/completions", &body).await
        }
    });
    for r in futures::future::join_all(reqs).await {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    app.wait_idle().await;
    let m = app.get("/metrics").await.text();
    let gen_tokens = |e| sample(&m, &engine_series("lamina_generation_tokens_total", e));
    let per: Vec<f64> = (0..2)
        .map(|e| {
            sample(
                &m,
                &format!(
                    "lamina_router_requests_total{{model_name=\"{MODEL}\",engine=\"{e}\",route=\"load\"}}"
                ),
            )
        })
        .collect();
    assert_eq!(per.iter().sum::<f64>(), 8.0, "{m}");
    assert!(per.iter().all(|&n| n >= 3.0), "unbalanced: {per:?}\n{m}");
    assert_eq!(
        gen_tokens(0) + gen_tokens(1),
        sample(&m, &total_series("lamina_generation_tokens_total"))
    );
    assert!(gen_tokens(0) > 0.0 && gen_tokens(1) > 0.0, "{m}");
    assert_eq!(
        sample(&m, &total_series("lamina_kv_blocks_total")),
        2.0 * sample(&m, &engine_series("lamina_kv_blocks_total", 0))
    );
}

#[tokio::test]
async fn a_failed_replica_leaves_the_others_serving() {
    // both replicas fault on `!`; whichever gets that request fails, alone
    let faulty = |delay| Setup {
        fail_on: Some(u32::from(b'!')),
        ..slow(delay)
    };
    let app = app_replicas(vec![faulty(4), faulty(4)]);
    let normal = |i: usize| {
        let app = &app;
        async move {
            let body = json!({"prompt": format!("{i}a"), "max_tokens": 40});
            app.post_json("/v1/completions", &body).await
        }
    };
    let running = futures::future::join_all((0..4).map(normal));
    let fault = async {
        // once all four run, send the request that faults its replica
        while app.state.served().unwrap().replicas.stats().running < 4 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let body = json!({"prompt": "boom!a", "max_tokens": 5});
        app.post_json("/v1/completions", &body).await
    };
    let (replies, faulted) = tokio::join!(running, fault);
    let failed = app.state.served().unwrap().replicas.failures();
    assert_eq!(failed.len(), 1, "exactly one replica failed: {failed:?}");
    assert!(failed[0].1.contains("injected device fault"), "{failed:?}");
    let err = faulted.text();
    assert!(faulted.status.as_u16() >= 500, "{err}");
    assert!(err.contains("injected device fault"), "{err}");
    // requests on the survivor completed; those on the failed one ended
    // with an error naming the failure
    let mut completed = 0;
    for r in &replies {
        if r.status == 200 {
            let v = r.json();
            assert_eq!(v["choices"][0]["text"], "bcdefghijklmnopqrstuvwxy", "{v}");
            completed += 1;
        } else {
            assert!(r.text().contains("injected device fault"), "{}", r.text());
        }
    }
    assert!(
        completed >= 1,
        "the healthy replica finished what it accepted"
    );
    // new requests all go to the survivor
    for i in 0..3 {
        let r = normal(10 + i).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let h = app.get("/health").await;
    assert_eq!(h.status, 200);
    let v = h.json();
    assert_eq!(v["status"], "degraded", "{v}");
    assert_eq!(v["failed_engines"][0]["engine"], failed[0].0);
    let m = app.get("/metrics").await.text();
    let healthy = |e| sample(&m, &engine_series("lamina_engine_healthy", e));
    assert_eq!(healthy(failed[0].0), 0.0);
    assert_eq!(healthy(1 - failed[0].0), 1.0);
}

#[tokio::test]
async fn every_replica_failed_is_503() {
    let faulty = Setup {
        fail_on: Some(u32::from(b'!')),
        ..slow(0)
    };
    let app = app_replicas(vec![faulty]);
    let r = app
        .post_json("/v1/completions", &json!({"prompt": "!a", "max_tokens": 2}))
        .await;
    assert!(r.status.as_u16() >= 500, "{}", r.text());
    let r = app
        .post_json("/v1/completions", &json!({"prompt": "a", "max_tokens": 2}))
        .await;
    let v = r.assert_error(503, None);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("injected device fault"),
        "{v}"
    );
    let h = app.get("/health").await;
    assert_eq!(h.status, 503);
    assert_eq!(h.json()["status"], "failed");
}

#[tokio::test]
async fn disconnect_frees_blocks_on_the_replica_that_ran_it() {
    let app = app_replicas(vec![slow(2), slow(2)]);
    let body = json!({"prompt": "a", "max_tokens": 450, "ignore_eos": true, "stream": true});
    let resp = app
        .router
        .clone()
        .oneshot(post("/v1/completions", body.to_string()))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream: Body = resp.into_body();
    let frame = stream
        .frame()
        .await
        .expect("a first event")
        .expect("no error");
    assert!(frame.into_data().is_ok());
    let per = app.state.served().unwrap().replicas.per_engine_stats();
    let ran = per
        .iter()
        .position(|s| s.running == 1 && s.kv_blocks_used > 0)
        .unwrap_or_else(|| panic!("one replica runs it: {per:?}"));
    assert_eq!(per[1 - ran].kv_blocks_used, 0);
    drop(stream);
    app.wait_idle().await;
    let after = app.state.served().unwrap().replicas.per_engine_stats();
    assert_eq!(after[ran].kv_blocks_used, 0);
    assert!(after[ran].generation_tokens_total < 450);
}
