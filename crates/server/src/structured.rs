//! Structured output: `response_format` and lamina's `guided_regex` /
//! `guided_grammar` extensions turned into the engine's
//! [`engine::Constraint`].
//!
//! Contract: at most one constraint per request (two of `response_format`
//! with a JSON type, `guided_regex`, `guided_grammar` and a tool choice that
//! forces a call is a 400 naming the second); `response_format` `text` is no
//! constraint; `json_schema` needs a `name` of at most 64 letters, digits,
//! `_` or `-` and a `schema` object. Whether `llguidance` accepts the
//! schema, regex or grammar is decided by `Engine::submit`; its refusal is a
//! 400 naming the field it came from ([`Structured::param`]). Costs: O(size
//! of the fields).

use engine::Constraint;

use crate::error::ApiError;
use crate::protocol::ResponseFormat;

/// A request's constraint and the field it came from.
#[derive(Debug, Clone, Default)]
pub struct Structured {
    pub constraint: Option<Constraint>,
    /// `response_format`, `guided_regex`, `guided_grammar` or `tools`.
    pub param: &'static str,
}

/// Whether `name` is a valid OpenAI schema or function name.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The constraint of `response_format`, `guided_regex` and `guided_grammar`.
pub fn constraint(
    response_format: Option<&ResponseFormat>,
    guided_regex: Option<&str>,
    guided_grammar: Option<&str>,
) -> Result<Structured, ApiError> {
    let mut out = Structured::default();
    let mut set = |c: Constraint, param: &'static str| -> Result<(), ApiError> {
        if let Some(prev) = out.constraint.as_ref().map(|_| out.param) {
            return Err(ApiError::invalid_param(
                param,
                format!("`{param}` cannot be combined with `{prev}`: give one constraint."),
            ));
        }
        out.constraint = Some(c);
        out.param = param;
        Ok(())
    };
    if let Some(rf) = response_format {
        match rf.kind.as_str() {
            "text" => {}
            "json_object" => set(Constraint::JsonObject, "response_format")?,
            "json_schema" => {
                let Some(js) = &rf.json_schema else {
                    return Err(ApiError::invalid_param(
                        "response_format.json_schema",
                        "`response_format` of type `json_schema` needs a `json_schema` object.",
                    ));
                };
                if !valid_name(&js.name) {
                    return Err(ApiError::invalid_param(
                        "response_format.json_schema.name",
                        format!(
                            "`name` must be 1 to 64 letters, digits, `_` or `-`, got {:?}.",
                            js.name
                        ),
                    ));
                }
                let schema = match &js.schema {
                    Some(s) if s.is_object() => s.clone(),
                    Some(_) => {
                        return Err(ApiError::invalid_param(
                            "response_format.json_schema.schema",
                            "`schema` must be a JSON schema object.",
                        ));
                    }
                    // OpenAI's default: any JSON object
                    None => serde_json::json!({"type": "object"}),
                };
                set(Constraint::JsonSchema(schema), "response_format")?;
            }
            other => {
                return Err(ApiError::invalid_param(
                    "response_format.type",
                    format!(
                        "Unknown `response_format` type `{other}`; expected `text`, `json_object` or `json_schema`."
                    ),
                ));
            }
        }
    }
    if let Some(r) = guided_regex {
        set(Constraint::Regex(r.to_string()), "guided_regex")?;
    }
    if let Some(g) = guided_grammar {
        set(Constraint::Lark(g.to_string()), "guided_grammar")?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::JsonSchemaFormat;

    fn rf(kind: &str, schema: Option<serde_json::Value>, name: &str) -> ResponseFormat {
        ResponseFormat {
            kind: kind.into(),
            json_schema: schema.map(|s| JsonSchemaFormat {
                name: name.into(),
                description: None,
                schema: Some(s),
                strict: Some(true),
            }),
        }
    }

    #[test]
    fn formats_map_to_constraints() {
        let s = constraint(Some(&rf("text", None, "x")), None, None).unwrap();
        assert!(s.constraint.is_none());
        let s = constraint(Some(&rf("json_object", None, "x")), None, None).unwrap();
        assert_eq!(s.constraint, Some(Constraint::JsonObject));
        let schema = serde_json::json!({"type": "integer"});
        let s = constraint(
            Some(&rf("json_schema", Some(schema.clone()), "n")),
            None,
            None,
        )
        .unwrap();
        assert_eq!(s.constraint, Some(Constraint::JsonSchema(schema)));
        let s = constraint(None, Some("a+"), None).unwrap();
        assert_eq!(
            (s.constraint, s.param),
            (Some(Constraint::Regex("a+".into())), "guided_regex")
        );
    }

    #[test]
    fn bad_formats_name_the_field() {
        let cases = [
            (
                constraint(Some(&rf("xml", None, "x")), None, None),
                "response_format.type",
            ),
            (
                constraint(Some(&rf("json_schema", None, "x")), None, None),
                "response_format.json_schema",
            ),
            (
                constraint(
                    Some(&rf("json_schema", Some(serde_json::json!({})), "a b")),
                    None,
                    None,
                ),
                "response_format.json_schema.name",
            ),
            (
                constraint(
                    Some(&rf("json_schema", Some(serde_json::json!([1])), "a")),
                    None,
                    None,
                ),
                "response_format.json_schema.schema",
            ),
            (
                constraint(Some(&rf("json_object", None, "x")), Some("a"), None),
                "guided_regex",
            ),
            (
                constraint(None, Some("a"), Some("start: \"a\"")),
                "guided_grammar",
            ),
        ];
        for (r, param) in cases {
            let e = r.unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        }
    }
}
