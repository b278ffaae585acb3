//! The model's reply read back as calls (the format is in the module doc of
//! [`crate::tools`]). Costs: one JSON parse of the reply.

use serde_json::{Value, json};

/// A call parsed from the model's reply.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// The calls in `text` when the whole reply is one or more calls (module
/// doc) of known functions, at most one unless `parallel`; `None` otherwise
/// (the reply is content).
pub fn parse_calls(text: &str, names: &[String], parallel: bool) -> Option<Vec<ParsedCall>> {
    const TAG: &str = "<|python_tag|>";
    let mut rest = text.trim();
    let mut values = Vec::new();
    while !rest.is_empty() {
        rest = rest.strip_prefix(TAG).unwrap_or(rest).trim_start();
        let mut de = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = de.next()?.ok()?;
        rest = rest[de.byte_offset()..]
            .trim_start()
            .trim_start_matches([';', ','])
            .trim_start();
        match v {
            Value::Array(items) if values.is_empty() && rest.is_empty() => values = items,
            v => values.push(v),
        }
    }
    if values.is_empty() {
        return None;
    }
    let calls: Vec<ParsedCall> = values
        .iter()
        .map(|v| call_of(v, names))
        .collect::<Option<_>>()?;
    Some(if parallel {
        calls
    } else {
        calls.into_iter().take(1).collect()
    })
}

/// One call object of a known function.
fn call_of(v: &Value, names: &[String]) -> Option<ParsedCall> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_call(text: &str, names: &[String]) -> Option<ParsedCall> {
        parse_calls(text, names, false).map(|mut v| v.remove(0))
    }

    #[test]
    fn several_calls_parse_when_parallel() {
        let names = vec!["f".to_string(), "g".to_string()];
        let one = r#"{"name": "f", "parameters": {"a": 1}}"#;
        let two = r#"{"name": "g", "parameters": {}}"#;
        for text in [
            format!("{one}\n{two}"),
            format!("{one}; {two}"),
            format!("<|python_tag|>{one}<|python_tag|>{two}"),
            format!("[{one}, {two}]"),
        ] {
            let calls = parse_calls(&text, &names, true).unwrap();
            let got: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(got, ["f", "g"], "{text}");
            let first = parse_calls(&text, &names, false).unwrap();
            assert_eq!(first.len(), 1, "{text}");
        }
        // one unknown function or trailing text: the reply is content
        assert!(parse_calls(&format!("{one} {{\"name\": \"h\"}}"), &names, true).is_none());
        assert!(parse_calls(&format!("{one} done"), &names, true).is_none());
        assert!(parse_calls("[]", &names, true).is_none());
    }

    #[test]
    fn replies_parse_into_calls_of_known_functions_only() {
        let names = vec!["get_weather".to_string()];
        let c = parse_call(
            " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n",
            &names,
        )
        .unwrap();
        assert_eq!(c.name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&c.arguments).unwrap(),
            json!({"city": "Paris"})
        );
        let c = parse_call(
            r#"{"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}"#,
            &names,
        )
        .unwrap();
        assert_eq!(c.arguments, r#"{"city": "Oslo"}"#);
        assert!(parse_call(r#"{"name": "other", "parameters": {}}"#, &names).is_none());
        assert!(parse_call("It is sunny.", &names).is_none());
        assert!(parse_call(r#"{"name": "get_weather", "parameters": 3}"#, &names).is_none());
    }
}
