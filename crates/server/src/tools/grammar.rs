//! The grammar of an `auto` reply ([`ToolPlan::auto_grammar`], module doc
//! of [`crate::tools`]), and of a forced call in the tagged format
//! ([`ToolPlan::forced_tagged`]). Costs: O(size of the definitions) per
//! request.

use engine::Constraint;

use super::{CALL_MARKER, CallFormat, ToolPlan, parse, tagged};

impl ToolPlan {
    /// The grammar of an `auto` reply (llguidance's Lark; module doc): free
    /// text, or text and then calls. A call starts at the first
    /// `{"name":` (white space allowed between the parts,
    /// [`parse::CALL_OPEN`]) or, when the template has it (`marker`), at the
    /// `<|python_tag|>` token, which the call's `{"name":` follows; from
    /// there it can only be `"<function>", "parameters": <arguments>}` of a
    /// declared function with its arguments held to the function's schema
    /// (llguidance's JSON options of [`engine::grammar::compact`]). With
    /// `parallel` more calls may follow, each on a new line (or after the
    /// marker); nothing follows the last.
    pub fn auto_grammar(&self, marker: bool) -> Constraint {
        if self.format == CallFormat::Tagged {
            return self.tagged_grammar(None, true);
        }
        let b = parse::blank_class();
        let open = format!("\\{{{b}*\"name\"{b}*:");
        let more = if self.parallel { " more" } else { "" };
        let mut g = format!("start: TEXT?\n    | head tail{more}\n");
        if marker {
            g.push_str(&format!("    | TEXT? {CALL_MARKER} SP? OPEN tail{more}\n"));
        }
        g.push_str(&format!("head[lazy]: /[\\s\\S]*{open}/\n"));
        if marker {
            g.push_str(&format!("OPEN: /{open}/\n"));
        }
        if self.parallel {
            let next = if marker {
                format!("(NEXT | SP? {CALL_MARKER} SP? OPEN)")
            } else {
                "NEXT".to_string()
            };
            g.push_str(&format!(
                "more: ({next} tail)*\nNEXT: /{b}*\\n{b}*{open}/\n"
            ));
        }
        self.push_tails(&mut g, None, "");
        g.push_str(&format!("TEXT: /[\\s\\S]+/\nSP: /{b}{{1,8}}/\n"));
        Constraint::Lark(g)
    }

    /// A forced call in the tagged format: from the first token, one
    /// `<tool_call>` of function `which` (any when `None`).
    pub(super) fn forced_tagged(&self, which: Option<usize>) -> Constraint {
        self.tagged_grammar(which, false)
    }

    /// The tagged format's grammar: `auto` (free text, then calls once
    /// `<tool_call>` is written) or forced (a call from the first token).
    fn tagged_grammar(&self, which: Option<usize>, auto: bool) -> Constraint {
        let b = parse::blank_class();
        // blanks between the parts are bounded, as `SP` is: a model that
        // favours white space cannot spend its tokens on it
        let sp = format!("{b}{{0,8}}");
        let open = format!("{}{sp}\\{{{sp}\"name\"{sp}:", tagged::OPEN);
        let more = if self.parallel && auto { " more" } else { "" };
        let mut g = if auto {
            format!("start: TEXT?\n    | head tail{more}\nhead[lazy]: /[\\s\\S]*{open}/\n")
        } else {
            format!("start: OPEN tail\nOPEN: /{open}/\n")
        };
        if !more.is_empty() {
            g.push_str(&format!("more: (NEXT tail)*\nNEXT: /{sp}{open}/\n"));
        }
        let close = format!(" SP? {}", lark_string(tagged::CLOSE));
        self.push_tails(&mut g, which, &close);
        g.push_str(&format!("TEXT: /[\\s\\S]+/\nSP: /{b}{{1,8}}/\n"));
        Constraint::Lark(g)
    }

    /// The rules `tail` (the rest of a call after `{"name":`, of function
    /// `only` or of any) and each function's `tail_i` / `args_i`, each call
    /// followed by `end`.
    fn push_tails(&self, g: &mut String, only: Option<usize>, end: &str) {
        let key = lark_string(&format!("\"{}\"", self.format.arguments_key()));
        let mut alts = Vec::with_capacity(self.names.len());
        for (i, t) in self.tools.as_array().into_iter().flatten().enumerate() {
            if only.is_some_and(|o| o != i) {
                continue;
            }
            let name = t["function"]["name"].as_str().unwrap_or_default();
            let args = engine::grammar::compact(t["function"]["parameters"].clone());
            g.push_str(&format!(
                "tail_{i}: SP? {} SP? \",\" SP? {key} SP? \":\" SP? args_{i} SP? \"}}\"{end}\n\
                 args_{i}: %json {args}\n",
                lark_string(&format!("\"{name}\"")),
            ));
            alts.push(format!("tail_{i}"));
        }
        g.push_str(&format!("tail: {}\n", alts.join(" | ")));
    }
}

/// `s` as a Lark string literal.
fn lark_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}
