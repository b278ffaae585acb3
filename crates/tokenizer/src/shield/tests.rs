use super::*;

fn shield() -> Shield {
    let specials = ["<|im_start|>", "<|im_end|>", "<|im"].map(String::from);
    match Shield::new(&specials) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

/// The pieces of a rendered text, literals marked with brackets.
fn show(rendered: &str, lits: &Literals) -> String {
    pieces(rendered, lits)
        .iter()
        .map(|p| match p {
            Piece::Template(t) => t.to_string(),
            Piece::Literal(l) => format!("[{l}]"),
        })
        .collect()
}

#[test]
fn literals_are_swapped_and_restored_longest_first() {
    let s = shield();
    let mut lits = Literals::default();
    let text = "a<|im_end|>b<|im_start|>c<|imd<|im_end|>";
    let swapped = s.string(text, &mut lits).unwrap_or_default();
    assert!(!swapped.contains('<'), "{swapped:?}");
    // the same literal gets the same reference
    assert_eq!(lits.texts.len(), 3, "{:?}", lits.texts);
    assert_eq!(
        show(&swapped, &lits),
        "a[<|im_end|>]b[<|im_start|>]c[<|im]d[<|im_end|>]"
    );
    assert!(s.string("plain text", &mut lits).is_none());
}

#[test]
fn reserved_characters_in_user_text_are_literals_too() {
    let s = shield();
    let mut lits = Literals::default();
    // a forged reference to literal 0, written by the user
    let forged = format!(
        "x{REF_OPEN}{}{REF_CLOSE}y",
        char::from_u32(REF_DIGIT0).unwrap_or('0')
    );
    let first = s.string("<|im_end|>", &mut lits).unwrap_or_default();
    let swapped = s.string(&forged, &mut lits).unwrap_or_default();
    assert_eq!(
        show(&format!("{first}{swapped}"), &lits),
        format!(
            "[<|im_end|>]x[{REF_OPEN}][{}][{REF_CLOSE}]y",
            char::from_u32(REF_DIGIT0).unwrap_or('0')
        )
    );
}

#[test]
fn broken_references_stay_template_text() {
    let s = shield();
    let mut lits = Literals::default();
    let swapped = s.string("<|im_end|>", &mut lits).unwrap_or_default();
    let cut: String = swapped.chars().take(2).collect();
    assert_eq!(show(&format!("{cut}z"), &lits), format!("{cut}z"));
    // an index past the table
    let far = format!(
        "{REF_OPEN}{}{REF_CLOSE}",
        char::from_u32(REF_DIGIT0 + 9).unwrap_or('9')
    );
    assert_eq!(show(&far, &lits), far);
}

#[test]
fn every_string_and_key_of_the_conversation_is_shielded() {
    let s = shield();
    let mut lits = Literals::default();
    let mut m = ChatMessage::new("user<|im_end|>", "hi");
    m.tool_call_id = Some("id<|im_start|>".into());
    m.tool_calls = Some(
        serde_json::json!([{"function": {"name": "f<|im_end|>", "arguments": {"<|im_start|>k": [1, "v<|im"]}}}]),
    );
    let tools = serde_json::json!([{"function": {"name": "t", "description": "d<|im_end|>"}}]);
    let Some((msgs, tools)) = s.conversation(&[m], Some(&tools), &mut lits) else {
        panic!("nothing was shielded");
    };
    let all = format!("{msgs:?}{tools:?}");
    assert!(!all.contains("<|im"), "{all}");
    assert_eq!(msgs[0].content, "hi");
    let mut none = Literals::default();
    assert!(
        s.conversation(&[ChatMessage::new("user", "hi")], None, &mut none)
            .is_none()
    );
}
