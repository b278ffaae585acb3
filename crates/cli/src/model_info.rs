//! `lamina show MODEL` (a model's details, from its files: nothing is
//! fetched or loaded) and `lamina ps` (what a running `lamina serve` has
//! loaded: lamina has no daemon, so `ps` asks the server at `--url`, as
//! ollama's `ps` asks its daemon).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::models::human_size;

#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// A store id or short name (`lamina list`), a Hugging Face repo in the
    /// cache, a model directory or a .gguf file.
    pub model: String,
}

#[derive(clap::Args, Debug)]
pub struct PsArgs {
    /// The server to ask (a running `lamina serve`).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Its API key, when it requires one.
    #[arg(long, env = "LAMINA_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

pub fn show(args: ShowArgs) -> Result<()> {
    let store = checkpoint::store::Store::default_home();
    let dir = store.resolve(&args.model, false)?;
    let loaded = checkpoint::loader::load_config(&dir)?;
    let c = &loaded.config;
    let params = engine::speculate::draft_model::num_params(c);
    println!("model         {}", runtime::display_name(&args.model));
    println!("path          {}", dir.display());
    println!("architecture  {}", architecture(&dir));
    println!("parameters    {:.1}M", params as f64 / 1e6);
    println!("context       {} tokens", c.max_position_embeddings);
    println!(
        "layers        {} (hidden {}, heads {}, KV heads {}, head dim {})",
        c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    );
    println!("vocabulary    {}", c.vocab_size);
    println!("weights       {}", weight_format(&dir));
    println!("template      {}", template(&dir));
    println!("sampling      {}", loaded.generation.sampling_defaults());
    if let Some(r) = loaded.generation.repetition_penalty {
        println!("              repetition penalty {r} (generation_config.json)");
    }
    println!("files");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name(), e.metadata().ok()?)))
        .filter(|(_, m)| m.is_file())
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, m) in files {
        println!("  {:>9}  {}", human_size(m.len()), name.to_string_lossy());
    }
    let id = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    if let Some(id) = id.filter(|id| store.model_dir(id) == dir) {
        for f in store.downloads_of(&id) {
            let len = std::fs::metadata(&f).map_or(0, |m| m.len());
            println!("  {:>9}  {} (download)", human_size(len), f.display());
        }
        println!("on disk       {}", human_size(store.disk_bytes(&id)));
    }
    Ok(())
}

/// The weights' format: the store's record of the source (a GGUF's block
/// types), else the safetensors' dtype as `config.json` names it.
fn weight_format(dir: &Path) -> String {
    let read = |name: &str| -> Option<Value> {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).ok()?).ok()
    };
    if let Some(src) = read("lamina.json").and_then(|m| m["source"].as_str().map(String::from)) {
        return src;
    }
    let cfg = read("config.json").unwrap_or(Value::Null);
    let dtype = cfg["torch_dtype"].as_str().unwrap_or("unknown dtype");
    match cfg["quantization_config"]["quant_method"].as_str() {
        Some(q) => format!("safetensors, {q} quantised"),
        None => format!("safetensors, {dtype}"),
    }
}

/// The architecture `config.json` names (`architectures[0]`, else its
/// `model_type`).
fn architecture(dir: &Path) -> String {
    let cfg: Option<Value> = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let cfg = cfg.unwrap_or(Value::Null);
    let named = cfg["architectures"][0]
        .as_str()
        .or(cfg["model_type"].as_str());
    named.unwrap_or("unknown").to_string()
}

/// Whether the tokenizer ships a chat template, and its size.
fn template(dir: &Path) -> String {
    let cfg: Option<Value> = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let jinja = std::fs::read_to_string(dir.join("chat_template.jinja")).ok();
    let text = jinja.or_else(|| cfg?["chat_template"].as_str().map(String::from));
    match text {
        Some(t) => format!("chat template ({} characters)", t.len()),
        None => "no chat template (raw completion only)".into(),
    }
}

pub fn ps(args: PsArgs) -> Result<()> {
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let base = args.url.trim_end_matches('/').to_string();
    let body = rt.block_on(async {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .build()?;
        let mut req = http.get(format!("{base}/models"));
        if let Some(k) = &args.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.with_context(|| {
            format!(
                "no server answers at {base}: start one with `lamina serve`, or give its `--url`"
            )
        })?;
        let status = resp.status();
        let body: Value = resp
            .json()
            .await
            .with_context(|| format!("{base}/models did not answer JSON"))?;
        if !status.is_success() {
            bail!("{base}/models answered {status}: {body}");
        }
        anyhow::Ok(body)
    })?;
    let models = body["data"].as_array().cloned().unwrap_or_default();
    println!(
        "{:<28}  {:<9}  {:>9}  {:>9}  {:>7}  {:>8}  {:<20}",
        "MODEL", "STATE", "MEMORY", "IDLE", "RUNNING", "CONTEXT", "ADAPTER OF"
    );
    for m in models {
        let bytes = m["weights_bytes"].as_u64().unwrap_or(0) + m["kv_bytes"].as_u64().unwrap_or(0);
        let state = m["status"]["value"].as_str().unwrap_or("?");
        let loaded = state == "loaded";
        let idle = match (loaded, m["running"].as_u64().unwrap_or(0)) {
            (false, _) => "-".to_string(),
            (true, 0) => format!("{:.0}s", m["idle_seconds"].as_f64().unwrap_or(0.0)),
            (true, _) => "busy".to_string(),
        };
        println!(
            "{:<28}  {:<9}  {:>9}  {:>9}  {:>7}  {:>8}  {:<20}",
            m["id"].as_str().unwrap_or("?"),
            state,
            if loaded {
                human_size(bytes)
            } else {
                "-".into()
            },
            idle,
            m["running"].as_u64().unwrap_or(0),
            m["max_model_len"].as_u64().unwrap_or(0),
            m["parent"].as_str().unwrap_or("-"),
        );
    }
    Ok(())
}
