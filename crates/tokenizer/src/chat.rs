//! Chat templates: the Jinja template from tokenizer_config.json rendered with
//! `minijinja` the way Hugging Face `transformers` renders it, and the Llama 3
//! header format for Llama 3 vocabularies that ship no template.
//!
//! Contract (matching `transformers`' `apply_chat_template`):
//! - `trim_blocks` and `lstrip_blocks` are on, trailing newlines are dropped;
//! - the context holds `messages` (`role`, `content`, and `tool_calls` /
//!   `tool_call_id` where a message has them), `add_generation_prompt`,
//!   `bos_token` and `eos_token` (empty strings when the model has none),
//!   and `tools` when the caller passes function definitions;
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
//! server); [`ChatTemplate::new`] renders a one-message conversation once and
//! refuses a template that exhausts the budget there.
//!
//! Costs: the template is compiled and trial-rendered once in
//! [`ChatTemplate::new`]; a render is linear in the conversation.

use crate::{ChatMessage, TokenizerError};
use minijinja::{Environment, Error, ErrorKind, context};

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
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
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
            && reason.contains(OUT_OF_FUEL)
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
        let err = |e: Error| TokenizerError::Template {
            origin: self.origin.clone(),
            reason: if e.kind() == ErrorKind::OutOfFuel {
                format!("{OUT_OF_FUEL} ({TEMPLATE_FUEL} instructions) rendering this conversation")
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
            Some(t) => context! { tools => minijinja::Value::from_serialize(t), ..base },
            None => base,
        };
        tpl.render(ctx).map_err(err)
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// How a render that ran out of fuel is reported.
const OUT_OF_FUEL: &str = "the chat template exceeded its execution budget";

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
