//! One streamed completion request of `bench-serve`, timed chunk by chunk.
//!
//! Contract: [`send`] posts `{"prompt": [ids], "max_tokens", "stream": true,
//! "stream_options": {"include_usage": true}, "ignore_eos": true,
//! "temperature": 0}` and reads the server-sent events as they arrive: the
//! time of every `data:` chunk carrying text is recorded (the first is the
//! time to first token), the usage chunk gives the output token count.
//! Any transport error, non-200 status or malformed event makes the request
//! failed, with the reason kept for the report.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::{Value, json};

/// What the driver shares with every request.
pub struct Ctx {
    pub http: reqwest::Client,
    /// `{base}/v1/completions`.
    pub url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// Ask for `logprobs: 0`, so that tokens without text arrive too.
    pub logprobs: bool,
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
}

/// What happened to one request.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub sent: Option<Instant>,
    /// Arrival of each chunk that carried text.
    pub chunks: Vec<Instant>,
    pub finished: Option<Instant>,
    /// The request's prompt length (0 when no request was made).
    pub prompt_tokens: usize,
    /// `usage.completion_tokens`, else the number of text chunks.
    pub output_tokens: usize,
    pub error: Option<String>,
}

impl Outcome {
    pub fn failed(why: String) -> Outcome {
        Outcome {
            sent: None,
            chunks: Vec::new(),
            finished: None,
            prompt_tokens: 0,
            output_tokens: 0,
            error: Some(why),
        }
    }
}

/// The id of the first model `GET {base}/v1/models` lists.
pub async fn first_model(http: &reqwest::Client, base: &str, key: Option<&str>) -> Result<String> {
    let mut req = http.get(format!("{base}/v1/models"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach the server at {base} (is it running?)"))?;
    let status = resp.status();
    let body: Value = resp
        .json()
        .await
        .with_context(|| format!("{base}/v1/models did not answer JSON"))?;
    if !status.is_success() {
        bail!("{base}/v1/models answered {status}: {body}");
    }
    match body["data"][0]["id"].as_str() {
        Some(id) => Ok(id.to_string()),
        None => bail!("{base}/v1/models lists no model; pass --model"),
    }
}

/// Sends `spec` and times its stream.
pub async fn send(ctx: &Ctx, spec: &Spec) -> Outcome {
    let sent = Instant::now();
    let mut out = Outcome {
        sent: Some(sent),
        chunks: Vec::with_capacity(spec.max_tokens),
        finished: None,
        prompt_tokens: spec.prompt.len(),
        output_tokens: 0,
        error: None,
    };
    if let Err(e) = stream(ctx, spec, &mut out).await {
        out.error = Some(format!("{e:#}"));
    }
    out.finished = Some(Instant::now());
    out
}

async fn stream(ctx: &Ctx, spec: &Spec, out: &mut Outcome) -> Result<()> {
    let mut body = json!({
        "model": ctx.model,
        "prompt": spec.prompt,
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if ctx.logprobs {
        body["logprobs"] = json!(0);
    }
    let mut req = ctx.http.post(&ctx.url).json(&body);
    if let Some(k) = &ctx.api_key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.context("sending the request")?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        bail!("HTTP {status}: {}", text.trim());
    }
    let mut bytes = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut usage: Option<usize> = None;
    let mut done = false;
    while let Some(piece) = bytes.next().await {
        let piece = piece.context("reading the stream")?;
        let now = Instant::now();
        buf.extend_from_slice(&piece);
        while let Some(end) = find_event_end(&buf) {
            let event: Vec<u8> = buf.drain(..end.1).collect();
            let event = String::from_utf8_lossy(&event[..end.0]).into_owned();
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: Value = serde_json::from_str(data)
                    .with_context(|| format!("malformed event `{data}`"))?;
                if let Some(err) = v.get("error") {
                    bail!("error event: {err}");
                }
                if carries_tokens(&v) {
                    out.chunks.push(now);
                }
                if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                    usage = Some(n as usize);
                }
            }
        }
    }
    if !done {
        bail!("the stream ended without `data: [DONE]`");
    }
    out.output_tokens = usage.unwrap_or(out.chunks.len());
    Ok(())
}

/// Whether a stream event brings output tokens: text, or (with
/// `logprobs`) tokens whose text is empty.
fn carries_tokens(event: &Value) -> bool {
    let choice = &event["choices"][0];
    let text = choice["text"].as_str().is_some_and(|t| !t.is_empty());
    let tokens = choice["logprobs"]["tokens"]
        .as_array()
        .is_some_and(|t| !t.is_empty());
    text || tokens
}

/// `(end of the event's text, end including its blank-line separator)` of
/// the first complete event in `buf`.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| (i, i + 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::{carries_tokens, find_event_end};

    #[test]
    fn events_split_on_blank_lines_of_either_style() {
        assert_eq!(find_event_end(b"data: x\n\ndata: y"), Some((7, 9)));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some((7, 11)));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }

    #[test]
    fn tokens_without_text_count_when_their_logprobs_come() {
        let ev = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert!(carries_tokens(&ev(r#"{"choices":[{"text":"a"}]}"#)));
        assert!(!carries_tokens(&ev(r#"{"choices":[{"text":""}]}"#)));
        assert!(carries_tokens(&ev(
            r#"{"choices":[{"text":"","logprobs":{"tokens":["<|f|>"]}}]}"#
        )));
        assert!(!carries_tokens(&ev(r#"{"choices":[],"usage":{}}"#)));
    }
}
