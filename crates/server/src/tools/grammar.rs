//! The grammar of an `auto` reply ([`ToolPlan::auto_grammar`], module doc
//! of [`crate::tools`]). Costs: O(size of the definitions) per request.

use engine::Constraint;

use super::{CALL_MARKER, ToolPlan, parse};

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
        let mut alts = Vec::with_capacity(self.names.len());
        for (i, t) in self.tools.as_array().into_iter().flatten().enumerate() {
            let name = t["function"]["name"].as_str().unwrap_or_default();
            let args = engine::grammar::compact(t["function"]["parameters"].clone());
            g.push_str(&format!(
                "tail_{i}: SP? {} SP? \",\" SP? {} SP? \":\" SP? args_{i} SP? \"}}\"\n\
                 args_{i}: %json {args}\n",
                lark_string(&format!("\"{name}\"")),
                lark_string("\"parameters\""),
            ));
            alts.push(format!("tail_{i}"));
        }
        g.push_str(&format!("tail: {}\n", alts.join(" | ")));
        g.push_str(&format!("TEXT: /[\\s\\S]+/\nSP: /{b}{{1,8}}/\n"));
        Constraint::Lark(g)
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
