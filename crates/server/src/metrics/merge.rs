//! Several models' expositions as one: each metric family once, with its
//! `# HELP` and `# TYPE` lines once and every model's samples under them,
//! in the order the families first appear.

use std::collections::HashMap;

/// Merges the expositions of `parts` (each one model's, every sample
/// carrying its `model_name`) family by family.
pub fn merge(parts: &[String]) -> String {
    if let [one] = parts {
        return one.clone();
    }
    let mut order: Vec<String> = Vec::new();
    // per family: the part that introduced it, its header lines, its samples
    let mut families: HashMap<String, (usize, Vec<&str>, Vec<&str>)> = HashMap::new();
    for (at, part) in parts.iter().enumerate() {
        let mut current = String::new();
        for line in part.lines() {
            if let Some(rest) = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
            {
                current = rest.split(' ').next().unwrap_or_default().to_string();
                let family = families.entry(current.clone()).or_insert_with(|| {
                    order.push(current.clone());
                    (at, Vec::new(), Vec::new())
                });
                if family.0 == at {
                    family.1.push(line);
                }
            } else if !line.is_empty() {
                let family = families.entry(current.clone()).or_insert_with(|| {
                    order.push(current.clone());
                    (at, Vec::new(), Vec::new())
                });
                family.2.push(line);
            }
        }
    }
    let mut out = String::new();
    for name in order {
        if let Some((_, head, samples)) = families.get(&name) {
            for l in head.iter().chain(samples) {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_written_once_with_every_models_samples() {
        let a = "# HELP x X.\n# TYPE x gauge\nx{model_name=\"a\"} 1\n# HELP y Y.\n# TYPE y counter\ny{model_name=\"a\"} 2\n";
        let b = "# HELP x X.\n# TYPE x gauge\nx{model_name=\"b\"} 3\n# HELP y Y.\n# TYPE y counter\ny{model_name=\"b\"} 4\n";
        let m = merge(&[a.to_string(), b.to_string()]);
        assert_eq!(
            m,
            "# HELP x X.\n# TYPE x gauge\nx{model_name=\"a\"} 1\nx{model_name=\"b\"} 3\n\
             # HELP y Y.\n# TYPE y counter\ny{model_name=\"a\"} 2\ny{model_name=\"b\"} 4\n"
        );
        assert_eq!(merge(&[a.to_string()]), a);
    }
}
