//! What both call formats share: a parsed call, the white space allowed
//! between a call's parts, and one call object of a known function (the
//! untagged JSON format in `parse`, Qwen's tagged one in `tagged`).

use serde_json::{Value, json};

/// A call parsed from the model's reply.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// The white space the call format allows between its parts (the grammar
/// and the parser read the same set).
pub const BLANKS: [char; 4] = [' ', '\t', '\r', '\n'];

/// One call object of a known function.
pub(super) fn call_of(v: &Value, names: &[String]) -> Option<ParsedCall> {
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if !names.iter().any(|n| n == name) {
        return None;
    }
    let args = obj
        .get("parameters")
        .or_else(|| obj.get("arguments"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let args = match args {
        // some models write the arguments as a JSON string already
        Value::String(s) if serde_json::from_str::<Value>(&s).is_ok_and(|v| v.is_object()) => s,
        v if v.is_object() => v.to_string(),
        _ => return None,
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments: args,
    })
}
