//! Tool calling on chat completions: `tools` and `tool_choice` checked and
//! turned into what the prompt, the engine and the response need
//! ([`ToolPlan`]), the history's tool turns rendered, and the model's
//! output parsed back into `tool_calls`.
//!
//! Contract:
//! - The call format is the model's ([`CallFormat::of`] its chat template,
//!   the one place it is decided): a template that writes `<tool_call>`
//!   (Qwen2.5, Qwen3) teaches the tagged format, `<tool_call>\n{"name":
//!   "<function>", "arguments": {<arguments>}}\n</tool_call>` (`super::tagged`);
//!   any other the JSON one Llama 3.1 / 3.2 templates teach, a JSON object
//!   `{"name": "<function>", "parameters": {<arguments>}}`. Either reads the
//!   other key as a synonym. A
//!   reply may be text, calls, or text and then calls (the text is returned
//!   as the reply's text, [`split_reply`]). With `parallel_tool_calls` true
//!   (the default) several calls may follow one another (tagged: separated
//!   by white space; JSON: by white space,
//!   `;` or `,`, each may start with `<|python_tag|>`, or a whole
//!   reply that is a JSON array of them); with `false` only the first call
//!   is returned. A forced call (below) is one call.
//! - Templates that read `tools` (Llama 3.1 / 3.2) get the definitions in
//!   OpenAI's shape and the history's `tool_calls` with their arguments as
//!   objects; for templates that do not (SmolLM2), [`fallback_system`]
//!   describes the functions and the format in a system message (appended
//!   to the first system message, or placed first), an assistant call turn
//!   is rendered as its JSON text and a `tool` turn as a message of role
//!   `tool`.
//! - `tool_choice`: `none` renders no tools and parses nothing; `auto` (the
//!   default with tools) renders them, lets the reply be text or calls and
//!   parses the calls it ends with: decoding follows
//!   [`ToolPlan::auto_grammar`], a lazy grammar: text is free until it
//!   writes `{"name":` (or the template's `<|python_tag|>` marker; tagged:
//!   `<tool_call>`); from
//!   there the reply can only be calls of declared functions with arguments
//!   valid against their `parameters` (unless the request has its own
//!   constraint, `response_format` or `guided_*`: then that one holds and
//!   calls are parsed only); `required` and a named function constrain
//!   decoding to a call (of any tool, or of that one) from the first token.
//! - Every definition is checked: `type` is `function`, the name is 1 to 64
//!   letters, digits, `_` or `-` and unique, `parameters` a JSON object;
//!   each error is a 400 naming the field (`tools[2].function.name`).
//!
//! Costs: O(size of the definitions) per request (their sizes are limited
//! before, [`crate::limits`]); parsing a reply is one
//! JSON parse of the output.

use std::collections::HashSet;

use engine::Constraint;
use serde_json::{Value, json};
use tokenizer::ChatMessage;

use crate::error::ApiError;
use crate::protocol::{Message, Tool, ToolChoice};
use crate::structured::valid_name;

mod call;
mod grammar;
mod parse;
mod tagged;
pub use call::ParsedCall;
pub use parse::{CallFormat, CallStream, Split, parse_calls, split_reply};

/// What a request's tools mean for its prompt, decoding and response.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The definitions in OpenAI's shape, for the template.
    pub tools: Value,
    /// The callable function names.
    pub names: Vec<String>,
    /// A forced call (`required` or a named function).
    pub constraint: Option<Constraint>,
    /// Several calls per reply allowed (`parallel_tool_calls`, default true).
    pub parallel: bool,
    /// How the model writes its calls.
    pub format: CallFormat,
}

fn bad(param: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// The schema of a call of `name` with arguments held to `parameters`,
/// under the format's key.
fn call_schema(format: CallFormat, name: &str, parameters: &Value) -> Value {
    let key = format.arguments_key();
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, key: parameters},
        "required": ["name", key],
        "additionalProperties": false,
    })
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no
/// tool is to be rendered (no tools, or `tool_choice: none`). Calls are
/// asked for (and held to) in `format`, the model's.
pub fn plan(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    parallel: Option<bool>,
    format: CallFormat,
) -> Result<Option<ToolPlan>, ApiError> {
    let Some(tools) = tools else {
        if choice.is_some() {
            return Err(bad("tool_choice", "`tool_choice` needs `tools`."));
        }
        return Ok(None);
    };
    let mut names: Vec<String> = Vec::with_capacity(tools.len());
    let mut seen: HashSet<&str> = HashSet::with_capacity(tools.len());
    let mut defs = Vec::with_capacity(tools.len());
    let mut schemas = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(bad(
                format!("tools[{i}].type"),
                format!("Only `function` tools are supported, got `{}`.", t.kind),
            ));
        }
        let f = &t.function;
        check_name(format!("tools[{i}].function.name"), &f.name)?;
        if !seen.insert(f.name.as_str()) {
            return Err(bad(
                format!("tools[{i}].function.name"),
                format!("The function `{}` is defined twice.", f.name),
            ));
        }
        let params = match &f.parameters {
            None => json!({"type": "object", "properties": {}, "additionalProperties": false}),
            Some(p) if p.is_object() => p.clone(),
            Some(_) => {
                return Err(bad(
                    format!("tools[{i}].function.parameters"),
                    "`parameters` must be a JSON schema object.",
                ));
            }
        };
        let mut def = json!({"name": f.name, "parameters": params});
        if let Some(d) = &f.description {
            def["description"] = Value::String(d.clone());
        }
        defs.push(json!({"type": "function", "function": def}));
        schemas.push(call_schema(format, &f.name, &params));
        names.push(f.name.clone());
    }
    let forced = match choice {
        None => None,
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => return Ok(None),
            "auto" => None,
            "required" => Some(None),
            other => {
                return Err(bad(
                    "tool_choice",
                    format!(
                        "Unknown `tool_choice` `{other}`; expected `none`, `auto`, `required` or a named function."
                    ),
                ));
            }
        },
        Some(ToolChoice::Named(n)) => {
            if n.kind != "function" {
                return Err(bad(
                    "tool_choice.type",
                    format!("Only `function` can be chosen, got `{}`.", n.kind),
                ));
            }
            match names.iter().position(|x| *x == n.function.name) {
                Some(at) => Some(Some(at)),
                None => {
                    return Err(bad(
                        "tool_choice.function.name",
                        format!("`{}` is not one of `tools`.", n.function.name),
                    ));
                }
            }
        }
    };
    if tools.is_empty() && forced.is_some() {
        return Err(bad(
            "tool_choice",
            "A call cannot be required of an empty `tools`.",
        ));
    }
    if tools.is_empty() {
        return Ok(None);
    }
    let mut plan = ToolPlan {
        tools: Value::Array(defs),
        names,
        constraint: None,
        parallel: parallel.unwrap_or(true),
        format,
    };
    plan.constraint = forced.map(|which| match (format, which) {
        (CallFormat::Tagged, which) => plan.forced_tagged(which),
        (CallFormat::Json, Some(at)) => Constraint::JsonSchema(schemas[at].clone()),
        (CallFormat::Json, None) if schemas.len() == 1 => {
            Constraint::JsonSchema(schemas[0].clone())
        }
        (CallFormat::Json, None) => Constraint::JsonSchema(json!({"anyOf": schemas})),
    });
    Ok(Some(plan))
}

/// The call marker Llama 3.x templates teach (a special token).
pub const CALL_MARKER: &str = "<|python_tag|>";

impl ToolPlan {
    /// The schema of one call of any of the functions.
    fn any_call_schema(&self) -> Value {
        let mut schemas: Vec<Value> = self
            .tools
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                call_schema(
                    self.format,
                    t["function"]["name"].as_str().unwrap_or_default(),
                    &t["function"]["parameters"],
                )
            })
            .collect();
        if schemas.len() == 1 {
            schemas.remove(0)
        } else {
            json!({"anyOf": schemas})
        }
    }

    /// Every function's call schema (what `required` would force), for
    /// checking the definitions with the grammar engine when another
    /// constraint holds the reply.
    pub fn check_constraint(&self) -> Constraint {
        Constraint::JsonSchema(self.any_call_schema())
    }
}

/// The system text describing the functions and the call format, for
/// templates that do not render `tools` themselves (module doc).
pub fn fallback_system(tools: &Value) -> String {
    let mut s = String::from(
        "You can call functions. To call one, reply with only a JSON object of the form \
         {\"name\": <function name>, \"parameters\": <arguments object>} and nothing else. \
         Otherwise answer normally. The functions:",
    );
    for t in tools.as_array().into_iter().flatten() {
        s.push('\n');
        s.push_str(&t["function"].to_string());
    }
    s
}

/// A function name, in a definition or a call of the history: what OpenAI
/// accepts, so it cannot carry prompt text.
fn check_name(field: String, name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        return Ok(());
    }
    let shown: String = name.chars().take(80).collect();
    Err(bad(
        field,
        format!("A function name must be 1 to 64 letters, digits, `_` or `-`, got {shown:?}."),
    ))
}

/// An assistant call turn of the history: the template's `tool_calls`
/// (arguments parsed to objects) and the call's JSON text (for templates
/// that do not render calls). Errors name `messages[i].tool_calls[j]`.
pub fn history_calls(i: usize, m: &Message) -> Result<Option<(Value, String)>, ApiError> {
    let Some(calls) = &m.tool_calls else {
        return Ok(None);
    };
    if m.role != "assistant" {
        return Err(bad(
            format!("messages[{i}].tool_calls"),
            "Only assistant messages carry `tool_calls`.",
        ));
    }
    let mut out = Vec::with_capacity(calls.len());
    let mut text = Vec::with_capacity(calls.len());
    for (j, c) in calls.iter().enumerate() {
        if c.kind != "function" {
            return Err(bad(
                format!("messages[{i}].tool_calls[{j}].type"),
                format!("Only `function` calls are supported, got `{}`.", c.kind),
            ));
        }
        check_name(
            format!("messages[{i}].tool_calls[{j}].function.name"),
            &c.function.name,
        )?;
        let args: Value = serde_json::from_str(&c.function.arguments).map_err(|e| {
            bad(
                format!("messages[{i}].tool_calls[{j}].function.arguments"),
                format!("`arguments` must be a JSON text: {e}"),
            )
        })?;
        text.push(json!({"name": c.function.name, "parameters": args}).to_string());
        out.push(json!({
            "id": c.id,
            "type": "function",
            "function": {"name": c.function.name, "arguments": args},
        }));
    }
    Ok(Some((Value::Array(out), text.join("\n"))))
}

/// Places the tools' description for a template that does not render
/// `tools`: appended to a leading system message, or as a new first one.
pub fn add_fallback_system(messages: &mut Vec<ChatMessage>, tools: &Value) {
    let text = fallback_system(tools);
    match messages.first_mut() {
        Some(m) if m.role == "system" => {
            m.content = format!("{}\n\n{text}", m.content);
        }
        _ => messages.insert(0, ChatMessage::new("system", text)),
    }
}

#[cfg(test)]
mod tests;
