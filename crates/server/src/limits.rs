//! Size and depth limits on the structures a request carries, checked
//! before any recursive or quadratic work touches them.
//!
//! Contract: [`InputLimits`] holds every limit (one place; `serve` flags
//! set them, the README's server section lists them). The checks here are
//! iterative and linear in the size of what they look at, stop at the first
//! limit exceeded, and refuse it with a 400 naming the field (`tools[3]
//! .function.parameters`), the limit and the value found. What passes may
//! still be recursed over by the grammar engine and the template; that runs
//! on the work pool's threads ([`crate::work`]), whose stacks are sized for
//! inputs within these limits.
//!
//! Costs: O(size of the checked fields); no allocation beyond an explicit
//! stack of at most `schema_depth` frames.

use serde_json::Value;

use crate::error::ApiError;
use crate::protocol::{ChatRequest, CompletionRequest, ResponseFormat, Stop};

/// The limits on user-supplied structures (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimits {
    /// JSON values (objects, arrays and scalars) in one schema; the
    /// `parameters` of all tools count together.
    pub schema_nodes: usize,
    /// Nesting of objects and arrays in a schema.
    pub schema_depth: usize,
    /// Bytes of `guided_regex`.
    pub regex_bytes: usize,
    /// Bytes of `guided_grammar`.
    pub grammar_bytes: usize,
    /// Rules (lines starting a definition) of `guided_grammar`.
    pub grammar_rules: usize,
    /// Nesting of groups (`(`, `[`, `{`) in a regex or a grammar.
    pub pattern_depth: usize,
    /// Entries of `tools`, and calls in one history message.
    pub tools: usize,
    /// Bytes of one short text field: a tool's `description`, a call's
    /// `id`, `function.name` or `tool_call_id`.
    pub field_bytes: usize,
    /// Bytes of one stop string.
    pub stop_bytes: usize,
    /// Entries of `messages`.
    pub messages: usize,
}

impl Default for InputLimits {
    fn default() -> Self {
        InputLimits {
            schema_nodes: 10_000,
            schema_depth: 32,
            regex_bytes: 16 << 10,
            grammar_bytes: 64 << 10,
            grammar_rules: 1_000,
            pattern_depth: 64,
            tools: 128,
            field_bytes: 16 << 10,
            stop_bytes: 1 << 10,
            messages: 10_000,
        }
    }
}

fn over(param: impl Into<String>, what: &str, got: usize, limit: usize, flag: &str) -> ApiError {
    ApiError::invalid_param(
        param,
        format!(
            "{what} is {got}, more than this server's limit of {limit} (`--{flag}`); \
             it was not processed."
        ),
    )
}

/// The values and nesting depth of `v`, walked without recursion; stops
/// (with a 400 naming `param`) as soon as either exceeds its limit, which
/// `*nodes` carries over between calls (several tools share one budget).
pub fn check_schema(
    v: &Value,
    param: &str,
    nodes: &mut usize,
    lim: &InputLimits,
) -> Result<(), ApiError> {
    let mut stack: Vec<(&Value, usize)> = vec![(v, 1)];
    while let Some((v, depth)) = stack.pop() {
        *nodes += 1;
        if *nodes > lim.schema_nodes {
            return Err(over(
                param,
                "The number of JSON values in the schema(s)",
                *nodes,
                lim.schema_nodes,
                "max-schema-nodes",
            ));
        }
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        if depth > lim.schema_depth {
            return Err(over(
                param,
                "The nesting depth of the schema",
                depth,
                lim.schema_depth,
                "max-schema-depth",
            ));
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    Ok(())
}

/// The deepest nesting of `(`/`[`/`{` in `text` (a backslash escapes the
/// next character; unbalanced closers are left to the grammar engine).
fn group_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut escaped) = (0usize, 0usize, false);
    for b in text.bytes() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// `guided_regex` within its byte and nesting limits.
pub fn check_regex(re: &str, lim: &InputLimits) -> Result<(), ApiError> {
    if re.len() > lim.regex_bytes {
        return Err(over(
            "guided_regex",
            "The regex's length in bytes",
            re.len(),
            lim.regex_bytes,
            "max-regex-bytes",
        ));
    }
    let depth = group_depth(re);
    if depth > lim.pattern_depth {
        return Err(over(
            "guided_regex",
            "The regex's group nesting",
            depth,
            lim.pattern_depth,
            "max-pattern-depth",
        ));
    }
    Ok(())
}

/// Whether `line` starts a Lark rule or terminal definition (`name:`,
/// `?name:`, `!name:`, `NAME.2:`).
fn starts_rule(line: &str) -> bool {
    let l = line.trim_start();
    let l = l.strip_prefix(['?', '!']).unwrap_or(l);
    let name_end = l
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(l.len());
    l.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && l[name_end..].trim_start().starts_with(':')
}

/// `guided_grammar` within its byte, rule and nesting limits.
pub fn check_grammar(g: &str, lim: &InputLimits) -> Result<(), ApiError> {
    if g.len() > lim.grammar_bytes {
        return Err(over(
            "guided_grammar",
            "The grammar's length in bytes",
            g.len(),
            lim.grammar_bytes,
            "max-grammar-bytes",
        ));
    }
    let rules = g.lines().filter(|l| starts_rule(l)).count();
    if rules > lim.grammar_rules {
        return Err(over(
            "guided_grammar",
            "The grammar's number of rules",
            rules,
            lim.grammar_rules,
            "max-grammar-rules",
        ));
    }
    let depth = group_depth(g);
    if depth > lim.pattern_depth {
        return Err(over(
            "guided_grammar",
            "The grammar's group nesting",
            depth,
            lim.pattern_depth,
            "max-pattern-depth",
        ));
    }
    Ok(())
}

/// One short text field within `field_bytes`.
pub fn check_field(
    text: &str,
    param: impl FnOnce() -> String,
    lim: &InputLimits,
) -> Result<(), ApiError> {
    if text.len() > lim.field_bytes {
        return Err(over(
            param(),
            "The field's length in bytes",
            text.len(),
            lim.field_bytes,
            "max-field-bytes",
        ));
    }
    Ok(())
}

/// A count (of `tools`, `messages`, calls) within `limit`.
pub fn check_count(
    param: impl Into<String>,
    got: usize,
    limit: usize,
    flag: &str,
) -> Result<(), ApiError> {
    if got > limit {
        return Err(over(param, "The number of entries", got, limit, flag));
    }
    Ok(())
}

/// Every stop string within `stop_bytes`.
pub fn check_stops(stops: &[String], lim: &InputLimits) -> Result<(), ApiError> {
    match stops.iter().map(String::len).max() {
        Some(n) if n > lim.stop_bytes => Err(over(
            "stop",
            "A stop string's length in bytes",
            n,
            lim.stop_bytes,
            "max-stop-bytes",
        )),
        _ => Ok(()),
    }
}

/// Every limit of a chat request (module doc).
pub fn check_chat(req: &ChatRequest, lim: &InputLimits) -> Result<(), ApiError> {
    check_count("messages", req.messages.len(), lim.messages, "max-messages")?;
    for (i, m) in req.messages.iter().enumerate() {
        if let Some(id) = &m.tool_call_id {
            check_field(id, || format!("messages[{i}].tool_call_id"), lim)?;
        }
        let Some(calls) = &m.tool_calls else { continue };
        check_count(
            format!("messages[{i}].tool_calls"),
            calls.len(),
            lim.tools,
            "max-tools",
        )?;
        for (j, c) in calls.iter().enumerate() {
            check_field(&c.id, || format!("messages[{i}].tool_calls[{j}].id"), lim)?;
            let name = &c.function.name;
            check_field(
                name,
                || format!("messages[{i}].tool_calls[{j}].function.name"),
                lim,
            )?;
        }
    }
    if let Some(tools) = &req.tools {
        check_count("tools", tools.len(), lim.tools, "max-tools")?;
        let mut nodes = 0;
        for (i, t) in tools.iter().enumerate() {
            if let Some(d) = &t.function.description {
                check_field(d, || format!("tools[{i}].function.description"), lim)?;
            }
            if let Some(p) = &t.function.parameters {
                let param = format!("tools[{i}].function.parameters");
                check_schema(p, &param, &mut nodes, lim)?;
            }
        }
    }
    check_constraints(
        req.response_format.as_ref(),
        req.guided_regex.as_deref(),
        req.guided_grammar.as_deref(),
        lim,
    )?;
    check_stop(req.stop.as_ref(), lim)
}

/// Every limit of a text-completion request (module doc).
pub fn check_completion(req: &CompletionRequest, lim: &InputLimits) -> Result<(), ApiError> {
    check_constraints(
        req.response_format.as_ref(),
        req.guided_regex.as_deref(),
        req.guided_grammar.as_deref(),
        lim,
    )?;
    check_stop(req.stop.as_ref(), lim)
}

fn check_constraints(
    rf: Option<&ResponseFormat>,
    regex: Option<&str>,
    grammar: Option<&str>,
    lim: &InputLimits,
) -> Result<(), ApiError> {
    if let Some(schema) = rf.and_then(|rf| rf.json_schema.as_ref()?.schema.as_ref()) {
        check_schema(schema, "response_format.json_schema.schema", &mut 0, lim)?;
    }
    if let Some(r) = regex {
        check_regex(r, lim)?;
    }
    if let Some(g) = grammar {
        check_grammar(g, lim)?;
    }
    Ok(())
}

fn check_stop(stop: Option<&Stop>, lim: &InputLimits) -> Result<(), ApiError> {
    match stop {
        Some(Stop::One(s)) => check_stops(std::slice::from_ref(s), lim),
        Some(Stop::Many(v)) => check_stops(v, lim),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn props(n: usize) -> Value {
        let p: serde_json::Map<String, Value> = (0..n)
            .map(|i| (format!("p{i}"), json!({"type": "string"})))
            .collect();
        json!({"type": "object", "properties": p})
    }

    fn nested(depth: usize) -> Value {
        let mut v = json!({"type": "string"});
        for _ in 0..depth {
            v = json!({"type": "array", "items": v});
        }
        v
    }

    #[test]
    fn schemas_past_the_limits_name_the_field() {
        let lim = InputLimits::default();
        for n in [1, 100, 2_000] {
            check_schema(&props(n), "s", &mut 0, &lim).unwrap();
        }
        for n in [6_000, 7_000, 50_000] {
            let e = check_schema(&props(n), "s", &mut 0, &lim).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("s"));
            assert!(e.message.contains("10000"), "{}", e.message);
        }
        check_schema(&nested(10), "s", &mut 0, &lim).unwrap();
        for d in [40, 100] {
            let e = check_schema(&nested(d), "d", &mut 0, &lim).unwrap_err();
            assert!(e.message.contains("depth"), "{}", e.message);
        }
        // the budget is shared across calls
        let mut used = 0;
        check_schema(&props(3_000), "a", &mut used, &lim).unwrap();
        assert!(check_schema(&props(3_000), "b", &mut used, &lim).is_err());
    }

    #[test]
    fn patterns_and_grammars_past_the_limits_are_refused() {
        let lim = InputLimits::default();
        check_regex("(a|b)+[0-9]{3}", &lim).unwrap();
        check_regex(r"\(\(\(", &lim).unwrap();
        assert!(check_regex(&"(".repeat(100), &lim).is_err());
        assert!(check_regex(&"a".repeat(20_000), &lim).is_err());
        let chain: String = (0..2_000)
            .map(|i| format!("r{i}: r{} \"x\"\n", i + 1))
            .collect();
        let e = check_grammar(&chain, &lim).unwrap_err();
        assert!(e.message.contains("rules"), "{}", e.message);
        check_grammar("start: \"a\" | b\n?b: \"c\"\nNUM.2: /[0-9]+/\n", &lim).unwrap();
        assert!(starts_rule("?b : x") && starts_rule("NUM.2: /x/") && !starts_rule("| \"a\""));
        assert!(check_stops(&["x".repeat(2_000)], &lim).is_err());
        check_stops(&["x".repeat(100)], &lim).unwrap();
    }
}
