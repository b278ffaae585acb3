//! Tests of tool planning: modes, forced calls, both formats' grammars,
//! the definitions' and the history's checks.
use super::*;
use crate::protocol::{FunctionDef, FunctionName, NamedToolChoice};

fn tool(name: &str, params: Option<Value>) -> Tool {
    Tool {
        kind: "function".into(),
        function: FunctionDef {
            name: name.into(),
            description: Some("d".into()),
            parameters: params,
            strict: None,
        },
    }
}

#[test]
fn modes_and_forced_calls() {
    let tools = vec![
        tool(
            "get_weather",
            Some(json!({"type": "object", "properties": {"city": {"type": "string"}}})),
        ),
        tool("now", None),
    ];
    assert!(plan(None, None, None, CallFormat::Json).unwrap().is_none());
    let none = ToolChoice::Mode("none".into());
    assert!(
        plan(Some(&tools), Some(&none), None, CallFormat::Json)
            .unwrap()
            .is_none()
    );
    let auto = plan(Some(&tools), None, Some(false), CallFormat::Json)
        .unwrap()
        .unwrap();
    assert!(auto.constraint.is_none());
    assert_eq!(auto.names, vec!["get_weather", "now"]);
    let req = ToolChoice::Mode("required".into());
    let p = plan(Some(&tools), Some(&req), None, CallFormat::Json)
        .unwrap()
        .unwrap();
    let Some(Constraint::JsonSchema(s)) = p.constraint else {
        panic!("required forces a call");
    };
    assert_eq!(s["anyOf"].as_array().map(Vec::len), Some(2));
    let named = ToolChoice::Named(NamedToolChoice {
        kind: "function".into(),
        function: FunctionName { name: "now".into() },
    });
    let p = plan(Some(&tools), Some(&named), None, CallFormat::Json)
        .unwrap()
        .unwrap();
    let Some(Constraint::JsonSchema(s)) = p.constraint else {
        panic!("a named function forces its call");
    };
    assert_eq!(s["properties"]["name"]["const"], "now");
}

#[test]
fn the_auto_grammar_names_each_function() {
    let tools = vec![tool("f", None), tool("g", Some(json!({"type": "object"})))];
    let p = plan(Some(&tools), None, Some(false), CallFormat::Json)
        .unwrap()
        .unwrap();
    let Constraint::Lark(g) = p.auto_grammar(true) else {
        panic!("a Lark grammar");
    };
    assert!(
        g.starts_with("start: TEXT?\n    | head tail\n    | TEXT? <|python_tag|> SP? OPEN tail\n"),
        "{g}"
    );
    assert!(!g.contains("more"), "one call only: {g}");
    assert!(g.contains(r#"tail_1: SP? "\"g\"" SP?"#), "{g}");
    assert!(
        g.contains(r#"args_1: %json {"type":"object","x-guidance""#),
        "{g}"
    );
    assert!(g.contains("tail: tail_0 | tail_1\n"), "{g}");
    let p = plan(Some(&tools), None, None, CallFormat::Json)
        .unwrap()
        .unwrap();
    let Constraint::Lark(g) = p.auto_grammar(false) else {
        panic!("a Lark grammar");
    };
    assert!(g.starts_with("start: TEXT?\n    | head tail more\n"), "{g}");
    assert!(g.contains("more: (NEXT tail)*\n"), "{g}");
    assert!(!g.contains("python_tag"), "{g}");
}

#[test]
fn the_tagged_grammars_open_with_the_tag() {
    let tools = vec![tool("f", None), tool("g", Some(json!({"type": "object"})))];
    let p = plan(Some(&tools), None, None, CallFormat::Tagged)
        .unwrap()
        .unwrap();
    let Constraint::Lark(g) = p.auto_grammar(true) else {
        panic!("a Lark grammar");
    };
    assert!(g.starts_with("start: TEXT?\n    | head tail more\n"), "{g}");
    assert!(
        g.contains(r#"head[lazy]: /[\s\S]*<tool_call>[ \t\r\n]{0,8}\{"#),
        "{g}"
    );
    assert!(g.contains(r#"SP? "\"arguments\"" SP?"#), "{g}");
    assert!(g.contains(r#"SP? "}" SP? "</tool_call>""#), "{g}");
    let named = ToolChoice::Named(NamedToolChoice {
        kind: "function".into(),
        function: FunctionName { name: "g".into() },
    });
    let p = plan(Some(&tools), Some(&named), None, CallFormat::Tagged)
        .unwrap()
        .unwrap();
    let Some(Constraint::Lark(g)) = p.constraint else {
        panic!("a forced tagged call is a Lark grammar");
    };
    assert!(g.starts_with("start: OPEN tail\nOPEN: /<tool_call>"), "{g}");
    assert!(g.contains("tail: tail_1\n") && !g.contains("tail_0"), "{g}");
    assert!(!g.contains("TEXT?"), "{g}");
}

#[test]
fn bad_definitions_name_the_field() {
    const J: CallFormat = CallFormat::Json;
    let dup = vec![tool("a", None), tool("a", None)];
    let mut wrong_type = vec![tool("a", None)];
    wrong_type[0].kind = "retrieval".into();
    let cases: Vec<(Result<Option<ToolPlan>, ApiError>, &str)> = vec![
        (plan(Some(&dup), None, None, J), "tools[1].function.name"),
        (
            plan(Some(&[tool("bad name", None)]), None, None, J),
            "tools[0].function.name",
        ),
        (
            plan(Some(&[tool("a", Some(json!(3)))]), None, None, J),
            "tools[0].function.parameters",
        ),
        (plan(Some(&wrong_type), None, None, J), "tools[0].type"),
        (
            plan(None, Some(&ToolChoice::Mode("auto".into())), None, J),
            "tool_choice",
        ),
        (
            plan(
                Some(&[tool("a", None)]),
                Some(&ToolChoice::Mode("always".into())),
                None,
                J,
            ),
            "tool_choice",
        ),
        (
            plan(
                Some(&[tool("a", None)]),
                Some(&ToolChoice::Named(NamedToolChoice {
                    kind: "function".into(),
                    function: FunctionName { name: "b".into() },
                })),
                None,
                J,
            ),
            "tool_choice.function.name",
        ),
    ];
    for (r, param) in cases {
        let e = r.unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
    }
}

/// A call in the history names its function like a definition does:
/// prompt text or a long name is refused, naming the call.
#[test]
fn history_call_names_are_checked_like_definitions() {
    for name in [
        "ok_name",
        "<|im_end|>",
        &"a".repeat(65),
        &"b".repeat(10_000),
        "",
    ] {
        let m: Message = serde_json::from_value(json!({"role": "assistant",
            "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": name, "arguments": "{}"}}]}))
        .unwrap();
        match history_calls(3, &m) {
            Ok(_) => assert!(valid_name(name), "{name:?} accepted"),
            Err(e) => {
                assert!(!valid_name(name));
                assert_eq!(
                    e.param.as_deref(),
                    Some("messages[3].tool_calls[0].function.name")
                );
                assert!(e.message.len() < 300, "{}", e.message);
            }
        }
    }
}

#[test]
fn fallback_system_goes_first_or_joins_the_system_turn() {
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let mut m = vec![ChatMessage::new("user", "hi")];
    add_fallback_system(&mut m, &tools);
    assert_eq!(m[0].role, "system");
    assert!(m[0].content.contains("\"name\":\"f\""), "{}", m[0].content);
    let mut m = vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "hi"),
    ];
    add_fallback_system(&mut m, &tools);
    assert_eq!(m.len(), 2);
    assert!(m[0].content.starts_with("Be brief.\n\n"));
}
