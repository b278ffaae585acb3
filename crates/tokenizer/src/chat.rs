//! Chat templates: the Jinja template from tokenizer_config.json rendered with
//! `minijinja` the way Hugging Face `transformers` renders it, and the Llama 3
//! header format for Llama 3 vocabularies that ship no template.
//!
//! Contract (matching `transformers`' `apply_chat_template`):
//! - `trim_blocks` and `lstrip_blocks` are on, trailing newlines are dropped;
//! - the context holds `messages` (`role`, `content`, and `tool_calls` /
//!   `tool_call_id` where a message has them), `add_generation_prompt`,
//!   `bos_token` and `eos_token` (empty strings when the model has none),
//!   `tools` when the caller passes function definitions, and the caller's
//!   extra variables ([`ChatVars::kwargs`], `chat_template_kwargs` such as
//!   Qwen3's `enable_thinking`), which never replace the names above;
//! - `raise_exception(msg)` fails the render with `msg`; `strftime_now(fmt)`
//!   formats the current UTC time with C `strftime` directives;
//! - Python string / dict / list methods (`.strip()`, `.startswith()`,
//!   `.items()`, ...) work through `minijinja-contrib`'s pycompat.
//!
//! Known gap: `tojson` is minijinja's (HTML-safe escaping, compact
//! separators), not Python's `json.dumps`; only tool-calling templates use it.
//!
//! A render may execute at most [`TEMPLATE_FUEL`] template instructions (a
//! template that loops longer is an error for that conversation, not a hung
//! server) and build or write at most [`render_byte_budget`] bytes, charged
//! as they are made (see `budget`; a template that doubles a string in a
//! loop fails, it does not exhaust memory); [`ChatTemplate::new`] renders a
//! one-message conversation once and refuses a template that exhausts
//! either budget there. Templates may not use names starting with
//! `__lamina_` (the budget's own functions).
//!
//! Costs: the template is compiled and trial-rendered once in
//! [`ChatTemplate::new`]; a render is linear in the conversation.

use crate::{ChatMessage, TokenizerError};
use minijinja::machinery::{Vm, get_compiled_template, make_string_output};
use minijinja::value::{Rest, Value};
use minijinja::{Environment, Error, ErrorKind, State, context};

mod budget;

/// A token present in every Llama 3 vocabulary (and the header format).
pub const LLAMA3_HEADER_TOKEN: &str = "<|start_header_id|>";

/// The Llama 3 header format, used when a Llama 3 model ships no template.
pub const LLAMA3_FALLBACK_TEMPLATE: &str = "<|begin_of_text|>\
{% for message in messages %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n\
{{ message.content }}<|eot_id|>{% endfor %}\
{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

const TEMPLATE_NAME: &str = "chat";

/// Template instructions one render may execute (minijinja's fuel): a few
/// thousand per message for real templates, well under 0.1 s of CPU.
pub const TEMPLATE_FUEL: u64 = 10_000_000;

/// The bytes one render may build and write, at least: real templates
/// build a few times their input.
pub const TEMPLATE_MIN_BYTES: u64 = 64 << 20;
/// Bytes a render may build and write per byte of its input, past
/// [`TEMPLATE_MIN_BYTES`].
pub const TEMPLATE_BYTES_PER_INPUT_BYTE: u64 = 16;

/// The byte budget of a render whose messages and tools hold `input_bytes`.
pub fn render_byte_budget(input_bytes: u64) -> u64 {
    TEMPLATE_MIN_BYTES.max(input_bytes.saturating_mul(TEMPLATE_BYTES_PER_INPUT_BYTE))
}

/// What a render puts in the template's context besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatVars<'a> {
    /// OpenAI's list of function definitions, as `tools`.
    pub tools: Option<&'a serde_json::Value>,
    /// Extra top-level variables (`chat_template_kwargs`).
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

impl<'a> ChatVars<'a> {
    /// Only `tools`.
    pub fn tools(tools: Option<&'a serde_json::Value>) -> Self {
        ChatVars {
            tools,
            kwargs: None,
        }
    }
}

/// The names the render itself sets: extra variables cannot replace them.
pub const RESERVED_VARS: [&str; 5] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// Names the file the template came from, for errors.
    origin: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` / `eos_token` are the texts the template
    /// sees under those names. A syntax error names `origin`.
    pub fn new(
        source: String,
        bos_token: String,
        eos_token: String,
        origin: &str,
    ) -> Result<ChatTemplate, TokenizerError> {
        if source.contains(budget::RESERVED_PREFIX) {
            return Err(TokenizerError::Template {
                origin: origin.to_string(),
                reason: format!(
                    "names starting with `{}` are reserved",
                    budget::RESERVED_PREFIX
                ),
            });
        }
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(checked_method);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_function(budget::CHARGE_MADE, budget::charge_made);
        env.add_function(budget::CHARGE_RETURNED, budget::charge_returned);
        env.add_function(budget::CHARGE_WRITTEN, budget::charge_written);
        env.add_function(budget::CHARGE_LEN, budget::charge_len);
        for (name, filter) in [
            ("indent", Value::from_function(minijinja::filters::indent)),
            ("tojson", Value::from_function(minijinja::filters::tojson)),
            ("format", Value::from_function(minijinja::filters::format)),
        ] {
            env.add_filter(name, move |state: &State, args: Rest<Value>| {
                check_counts(&args)?;
                filter.call(state, &args)
            });
        }
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| TokenizerError::Template {
                origin: origin.to_string(),
                reason: format!("{e:#}"),
            })?;
        let template = ChatTemplate {
            env,
            source,
            bos_token,
            eos_token,
            origin: origin.to_string(),
        };
        // A template that cannot render one user message within the budget
        // would fail (or, without one, hang) every request: refuse it now.
        // Other trial errors are left to requests (a template may reject a
        // conversation without a system turn, say).
        let trial = [ChatMessage::new("user", "Hello")];
        if let Err(e) = template.render(&trial, true)
            && let TokenizerError::Template { reason, .. } = &e
            && (reason.contains(OUT_OF_FUEL) || reason.contains(OUT_OF_BYTES))
        {
            return Err(e);
        }
        Ok(template)
    }

    /// The Llama 3 header format ([`LLAMA3_FALLBACK_TEMPLATE`]).
    pub fn llama3_fallback(
        eos_token: String,
        origin: &str,
    ) -> Result<ChatTemplate, TokenizerError> {
        Self::new(
            LLAMA3_FALLBACK_TEMPLATE.to_string(),
            "<|begin_of_text|>".to_string(),
            eos_token,
            origin,
        )
    }

    /// Renders the conversation; with `add_generation_prompt` the result ends
    /// with the header that opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with `tools` (OpenAI's list of function
    /// definitions) in the context; absent, `tools` is undefined, as in
    /// `transformers` without tools.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with(messages, ChatVars::tools(tools), add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with `vars` in the context (module doc).
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        vars: ChatVars<'_>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let tools = vars.tools;
        let budget = render_byte_budget(input_bytes(messages, tools));
        let scope = budget::Scope::enter(budget);
        let err = |e: Error| TokenizerError::Template {
            origin: self.origin.clone(),
            reason: if e.kind() == ErrorKind::OutOfFuel {
                format!("{OUT_OF_FUEL} ({TEMPLATE_FUEL} instructions) rendering this conversation")
            } else if scope.exhausted() {
                budget::exhausted_reason(scope.budget())
            } else {
                format!("{e:#}")
            },
        };
        let tpl = self.env.get_template(TEMPLATE_NAME).map_err(err)?;
        let base = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let ctx = match tools {
            Some(t) => context! { tools => Value::from_serialize(t), ..base },
            None => base,
        };
        let ctx = match vars.kwargs {
            Some(kw) => {
                let extra: serde_json::Map<String, serde_json::Value> = kw
                    .iter()
                    .filter(|(k, _)| !RESERVED_VARS.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                context! { ..ctx, ..Value::from_serialize(&extra) }
            }
            None => ctx,
        };
        let compiled = get_compiled_template(&tpl);
        let code = budget::rewrite(&compiled.instructions);
        let blocks = compiled
            .blocks
            .iter()
            .map(|(name, b)| (*name, budget::rewrite(b)))
            .collect();
        let mut text = String::new();
        let mut out = make_string_output(&mut text);
        Vm::new(&self.env)
            .eval(&code, ctx, &blocks, &mut out, compiled.initial_auto_escape)
            .map_err(err)?;
        Ok(text)
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// How a render that ran out of fuel is reported.
const OUT_OF_FUEL: &str = "the chat template exceeded its execution budget";
/// Part of how a render that ran out of bytes is reported.
const OUT_OF_BYTES: &str = "memory budget";

/// The bytes of a conversation's strings and tools (what a render's byte
/// budget scales with).
fn input_bytes(messages: &[ChatMessage], tools: Option<&serde_json::Value>) -> u64 {
    let json = |v: Option<&serde_json::Value>| v.map_or(0, |v| v.to_string().len());
    let msgs: usize = messages
        .iter()
        .map(|m| {
            m.role.len()
                + m.content.len()
                + m.tool_call_id.as_ref().map_or(0, String::len)
                + json(m.tool_calls.as_ref())
        })
        .sum();
    (msgs + json(tools)) as u64
}

/// Refuses a count argument (a width, an indent) larger than what is left
/// of the render's byte budget: the call would build at least that much.
fn check_counts(args: &[Value]) -> Result<(), Error> {
    let left = budget::left();
    let too_big = |v: &Value| v.as_i64().is_some_and(|n| n > 0 && n as u64 > left);
    let kwarg_values = args
        .iter()
        .filter(|a| a.kind() == minijinja::value::ValueKind::Map)
        .flat_map(|m| {
            m.try_iter()
                .into_iter()
                .flatten()
                .filter_map(move |k| m.get_item(&k).ok())
        });
    match args.iter().cloned().chain(kwarg_values).find(too_big) {
        Some(n) => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("a count of {n} exceeds the {OUT_OF_BYTES} left ({left} bytes)"),
        )),
        None => Ok(()),
    }
}

/// Python's string / dict / list methods (`minijinja-contrib`'s pycompat),
/// with count arguments (`.center(n)`, `.zfill(n)`) held to the byte budget.
fn checked_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    check_counts(args)?;
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// `raise_exception(msg)`: templates call it to reject a conversation.
fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: the current UTC time formatted with C `strftime`
/// directives (`%a %A %b %B %d %e %H %I %j %m %M %p %S %y %Y %Z %%`).
fn strftime_now(fmt: String) -> Result<String, Error> {
    strftime(&time::OffsetDateTime::now_utc(), &fmt)
}

fn strftime(t: &time::OffsetDateTime, fmt: &str) -> Result<String, Error> {
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month = t.month().to_string();
        let weekday = t.weekday().to_string();
        let hour12 = match t.hour() % 12 {
            0 => 12,
            h => h,
        };
        match chars.next() {
            Some('a') => out.push_str(weekday.get(..3).unwrap_or(&weekday)),
            Some('A') => out.push_str(&weekday),
            Some('b') => out.push_str(month.get(..3).unwrap_or(&month)),
            Some('B') => out.push_str(&month),
            Some('d') => out.push_str(&format!("{:02}", t.day())),
            Some('e') => out.push_str(&format!("{:>2}", t.day())),
            Some('H') => out.push_str(&format!("{:02}", t.hour())),
            Some('I') => out.push_str(&format!("{hour12:02}")),
            Some('j') => out.push_str(&format!("{:03}", t.ordinal())),
            Some('m') => out.push_str(&format!("{:02}", u8::from(t.month()))),
            Some('M') => out.push_str(&format!("{:02}", t.minute())),
            Some('p') => out.push_str(if t.hour() < 12 { "AM" } else { "PM" }),
            Some('S') => out.push_str(&format!("{:02}", t.second())),
            Some('y') => out.push_str(&format!("{:02}", t.year().rem_euclid(100))),
            Some('Y') => out.push_str(&t.year().to_string()),
            Some('Z') => out.push_str("UTC"),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{} in {fmt:?}",
                        other.map(String::from).unwrap_or_default()
                    ),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
