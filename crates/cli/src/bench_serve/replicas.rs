//! Per-replica load of a run, from the server's `/metrics` before and after
//! it: for each `engine` label, the requests the router placed there (by
//! prefix affinity / by load), tokens generated and prompt tokens served
//! from the prefix cache. Servers without these series (one engine of
//! another make) report nothing. Costs: two scrapes per run.

use std::collections::BTreeMap;

/// Per engine: (requests by prefix, requests by load, generated tokens, prefix-cache hit tokens).
pub type Loads = BTreeMap<String, [f64; 4]>;

/// Reads the per-engine series from a Prometheus text exposition.
pub fn parse(text: &str) -> Loads {
    let mut out = Loads::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        let label = |k: &str| {
            let key = format!("{k}=\"");
            let start = labels.find(&key)? + key.len();
            labels[start..].split('"').next().map(str::to_string)
        };
        let Some(engine) = label("engine") else {
            continue;
        };
        let slot = match (name, label("route").as_deref()) {
            ("lamina_router_requests_total", Some("prefix")) => 0,
            ("lamina_router_requests_total", Some("load")) => 1,
            ("lamina_generation_tokens_total", _) => 2,
            ("lamina_prefix_cache_hits_total", _) => 3,
            _ => continue,
        };
        out.entry(engine).or_default()[slot] = v;
    }
    out
}

/// Scrapes `{base}/metrics`; `None` when the server has none.
pub async fn scrape(http: &reqwest::Client, base: &str) -> Option<Loads> {
    let resp = http.get(format!("{base}/metrics")).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let loads = parse(&resp.text().await.ok()?);
    (!loads.is_empty()).then_some(loads)
}

/// One line per engine: what the run between `before` and `after` put on it.
pub fn report(before: &Loads, after: &Loads) -> Vec<String> {
    after
        .iter()
        .map(|(engine, a)| {
            let b = before.get(engine).copied().unwrap_or_default();
            let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
            format!(
                "engine {engine}: {} requests ({} by prefix, {} by load), {} tokens generated, {} prompt tokens from the prefix cache",
                d[0] + d[1],
                d[0],
                d[1],
                d[2],
                d[3]
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_engine_series_and_reports_deltas() {
        let before = parse(
            "lamina_generation_tokens_total{model_name=\"m\",engine=\"0\"} 5\n\
             lamina_generation_tokens_total{model_name=\"m\"} 5\n",
        );
        let after = parse(
            "# HELP x\n\
             lamina_generation_tokens_total{model_name=\"m\",engine=\"0\"} 15\n\
             lamina_generation_tokens_total{model_name=\"m\",engine=\"1\"} 7\n\
             lamina_router_requests_total{model_name=\"m\",engine=\"1\",route=\"prefix\"} 2\n\
             lamina_router_requests_total{model_name=\"m\",engine=\"1\",route=\"load\"} 1\n\
             lamina_prefix_cache_hits_total{model_name=\"m\",engine=\"1\"} 64\n",
        );
        let lines = report(&before, &after);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("engine 0: 0 requests"), "{lines:?}");
        assert!(lines[0].contains("10 tokens generated"), "{lines:?}");
        assert!(
            lines[1].contains(
                "3 requests (2 by prefix, 1 by load), 7 tokens generated, 64 prompt tokens"
            ),
            "{lines:?}"
        );
    }
}
