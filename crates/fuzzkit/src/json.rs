//! JSON inputs: arbitrary values with the numbers that break validation
//! ([`wild_number`]), and mutations of a valid document that replace or
//! remove its fields one by one ([`mutated_json`]).

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Number, Value};

/// Numbers at the edges of every type a field may be read as: zero,
/// negatives, u32 / i64 / u64 limits, fractions, floats too large for any
/// integer or for f32, subnormals.
pub fn wild_number() -> impl Strategy<Value = Value> {
    let edges: Vec<Value> = vec![
        0.into(),
        1.into(),
        (-1).into(),
        2.into(),
        u32::MAX.into(),
        (u64::from(u32::MAX) + 1).into(),
        i64::MAX.into(),
        i64::MIN.into(),
        u64::MAX.into(),
        (1u64 << 62).into(),
        Value::from(0.5),
        Value::from(-0.0),
        Value::from(1e-320),
        Value::from(1e-50),
        Value::from(3.5e38),
        Value::from(1e39),
        Value::from(1e300),
        Value::from(-1e300),
        Value::from(f64::MAX),
    ];
    prop_oneof![
        3 => proptest::sample::select(edges),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<f64>().prop_map(|x| Number::from_f64(x).map_or(Value::Null, Value::Number)),
    ]
}

/// Any JSON value, nested at most three levels, with [`wild_number`]s and
/// short strings (including the texts `NaN`, `inf` and special tokens).
pub fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        wild_number(),
        proptest::sample::select(vec!["", "NaN", "inf", "-1", "llama3", "silu", "<s>", "{{"])
            .prop_map(|s| Value::String(s.into())),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One edit of a JSON document: at the `Index`-th member of any object in
/// it (depth first), remove it or replace its value.
#[derive(Debug, Clone)]
enum Edit {
    Remove(Index),
    Replace(Index, Value),
    /// A new member with a name taken from the document (or a fresh one).
    Add(Index, Value),
}

/// Paths (member names from the root) of every object member of `v`.
fn member_paths(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Value::Object(m) = v {
        for (k, x) in m {
            prefix.push(k.clone());
            out.push(prefix.clone());
            member_paths(x, prefix, out);
            prefix.pop();
        }
    }
}

fn parent_of<'a>(root: &'a mut Value, path: &[String]) -> Option<&'a mut Map<String, Value>> {
    let mut at = root;
    for k in &path[..path.len() - 1] {
        at = at.as_object_mut()?.get_mut(k)?;
    }
    at.as_object_mut()
}

impl Edit {
    fn apply(&self, doc: &mut Value) {
        let mut paths = Vec::new();
        member_paths(doc, &mut Vec::new(), &mut paths);
        if paths.is_empty() {
            if let (Edit::Add(_, v), Value::Object(m)) = (self, &mut *doc) {
                m.insert("extra".into(), v.clone());
            }
            return;
        }
        match self {
            Edit::Remove(i) => {
                let p = i.get(&paths);
                if let Some(m) = parent_of(doc, p) {
                    m.remove(&p[p.len() - 1]);
                }
            }
            Edit::Replace(i, v) => {
                let p = i.get(&paths);
                if let Some(m) = parent_of(doc, p) {
                    m.insert(p[p.len() - 1].clone(), v.clone());
                }
            }
            Edit::Add(i, v) => {
                // a known name one level up or down: duplicates a field where
                // it does not belong
                let name = i.get(&paths).last().cloned().unwrap_or_default();
                if let Value::Object(m) = doc {
                    m.entry(format!("{name}_")).or_insert(v.clone());
                    if let Some(Value::Object(inner)) = m.values_mut().find(|x| x.is_object()) {
                        inner.insert(name, v.clone());
                    }
                }
            }
        }
    }
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        1 => any::<Index>().prop_map(Edit::Remove),
        4 => (any::<Index>(), arb_json()).prop_map(|(i, v)| Edit::Replace(i, v)),
        1 => (any::<Index>(), arb_json()).prop_map(|(i, v)| Edit::Add(i, v)),
    ]
}

/// `seed` with 0 to 5 of its members removed, replaced by arbitrary values
/// or duplicated elsewhere (shrinks to `seed` itself).
pub fn mutated_json(seed: Value) -> impl Strategy<Value = Value> {
    proptest::collection::vec(edit(), 0..6).prop_map(move |edits| {
        let mut doc = seed.clone();
        for e in &edits {
            e.apply(&mut doc);
        }
        doc
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn mutated_json_removes_and_replaces_nested_fields() {
        let seed = serde_json::json!({"a": 1, "b": {"c": "x", "d": [1, 2]}});
        let mut runner = TestRunner::deterministic();
        let (mut no_a, mut new_c) = (false, false);
        for _ in 0..300 {
            let v = mutated_json(seed.clone())
                .new_tree(&mut runner)
                .unwrap()
                .current();
            no_a |= v.get("a").is_none();
            new_c |= v.pointer("/b/c").is_some_and(|c| c != "x");
        }
        assert!(no_a && new_c, "removed a: {no_a}, replaced b.c: {new_c}");
    }
}
