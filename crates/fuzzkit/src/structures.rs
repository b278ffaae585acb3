//! Nested structures of a chosen size for the server's limits: JSON
//! schemas, Lark grammars and tool lists drawn from a few size parameters
//! (up to, and past, whatever limits the caller wants to cross).
//!
//! Each strategy draws its sizes (depth, width, total) and a seed, then
//! builds the structure from them, so a failure shrinks towards smaller
//! sizes rather than through the structure itself.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// A small deterministic generator (xorshift64) for the builders.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// A JSON schema nested up to `depth` levels with up to `width` children
/// per node and about `nodes` JSON values in all: objects (with
/// `required` and `additionalProperties`), arrays, `anyOf`, enums, a
/// recursive `$ref` and scalars.
pub fn nested_schema(depth: usize, width: usize, nodes: usize) -> impl Strategy<Value = Value> {
    (0..=depth, 0..=width, 1..=nodes.max(1), any::<u64>()).prop_map(|(d, w, n, seed)| {
        let mut budget = n;
        schema(&mut Rng(seed | 1), d, w, &mut budget)
    })
}

fn schema(rng: &mut Rng, depth: usize, width: usize, budget: &mut usize) -> Value {
    *budget = budget.saturating_sub(1);
    if depth == 0 || *budget == 0 {
        return match rng.below(5) {
            0 => json!({"type": "string", "maxLength": 8}),
            1 => json!({"type": "integer"}),
            2 => json!({"enum": ["a", "b", 3]}),
            3 => json!({"type": "boolean"}),
            _ => json!({"$ref": "#"}),
        };
    }
    let n = 1 + rng.below(width.max(1));
    match rng.below(3) {
        0 => {
            let mut props = Map::new();
            for i in 0..n {
                props.insert(format!("p{i}"), schema(rng, depth - 1, width, budget));
            }
            let required: Vec<Value> = (0..n)
                .filter(|_| rng.below(2) == 0)
                .map(|i| json!(format!("p{i}")))
                .collect();
            json!({"type": "object", "properties": props, "required": required,
                   "additionalProperties": rng.below(2) == 0})
        }
        1 => json!({"type": "array", "items": schema(rng, depth - 1, width, budget)}),
        _ => {
            let alts: Vec<Value> = (0..n)
                .map(|_| schema(rng, depth - 1, width, budget))
                .collect();
            json!({"anyOf": alts})
        }
    }
}

/// A Lark grammar of up to `rules` rules (a chain, alternatives, regex
/// terminals) whose bodies nest groups up to `depth` deep.
pub fn lark_grammar(rules: usize, depth: usize) -> impl Strategy<Value = String> {
    (1..=rules.max(1), 0..=depth, any::<u64>()).prop_map(|(n, d, seed)| {
        let mut rng = Rng(seed | 1);
        let mut g = String::new();
        for i in 0..n {
            let next = if i + 1 < n {
                format!(" r{}", i + 1)
            } else {
                String::new()
            };
            let name = if i == 0 {
                "start".to_string()
            } else {
                format!("r{i}")
            };
            let body = match rng.below(3) {
                0 => format!("\"x{i}\"{next}"),
                1 => format!("\"a\"{next} | \"b\"{next}"),
                _ => format!("/[0-9]{{1,3}}/{next}"),
            };
            let nest = if i == 0 { d } else { 0 };
            g.push_str(&format!(
                "{name}: {}{body}{}\n",
                "(".repeat(nest),
                ")".repeat(nest)
            ));
        }
        g
    })
}

/// A `tools` list of up to `count` function tools, some sharing a name,
/// each with [`nested_schema`] parameters.
pub fn tool_list(
    count: usize,
    depth: usize,
    width: usize,
    nodes: usize,
) -> impl Strategy<Value = Value> {
    proptest::collection::vec(
        (0..count.max(1) * 2, nested_schema(depth, width, nodes)),
        0..=count,
    )
    .prop_map(|tools| {
        let list: Vec<Value> = tools
            .into_iter()
            .map(|(name, params)| {
                let params = json!({"type": "object", "properties": {"x": params}});
                json!({"type": "function", "function": {
                        "name": format!("f{name}"), "description": "d", "parameters": params}})
            })
            .collect();
        Value::Array(list)
    })
}
