//! FP8 weights from the command line: `lamina quantize` writes the hub's
//! layouts, the CPU runs them (dequantised) and refuses damaged ones by
//! name, and on SmolLM2's real weights FP8 costs under 2.5% of perplexity
//! on the shipped English text, against BF16 (under 5% with the LM head in
//! FP8 too); an FP8 KV cache under 1% against a BF16 one.

mod support;

use std::path::{Path, PathBuf};

use support::{lamina, ok, stderr};

/// The repository's fixed English text (~2,000 tokens).
fn text() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/text/lighthouses.txt")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lamina-fp8-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `lamina perplexity ... --json`'s figure.
fn perplexity(model: &str, dtype: &str, extra: &[&str]) -> f64 {
    let t = text();
    let mut args = vec![
        "perplexity",
        "--model",
        model,
        "--device",
        "cpu",
        "--dtype",
        dtype,
        "--text",
        t.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = lamina(&args);
    let v: serde_json::Value = serde_json::from_str(ok(&out).trim()).expect("one JSON object");
    let ppl = v["perplexity"].as_f64().expect("a perplexity");
    assert!(v["tokens_scored"].as_u64().unwrap_or(0) > 1000, "{v}");
    ppl
}

#[test]
fn checkpoints_written_by_quantize_run_on_the_cpu() {
    let dir = scratch("ckpt");
    let src = support::synth_tiny(&dir, "bf16");
    let src = src.to_str().unwrap();
    for (name, extra) in [
        ("ct", vec![]),
        ("ct-static", vec!["--per-tensor", "--input-scale", "0.05"]),
        ("fp8", vec!["--layout", "fp8"]),
    ] {
        let out_dir = dir.join(name);
        let mut args = vec!["quantize", src, "--out", out_dir.to_str().unwrap()];
        args.extend(extra);
        ok(&lamina(&args));
        let cfg = std::fs::read_to_string(out_dir.join("config.json")).unwrap();
        assert!(cfg.contains("quantization_config"), "{name}: {cfg}");
        let out = support::generate(
            None,
            out_dir.to_str().unwrap(),
            &["--max-tokens", "4", "--temperature", "0", "hi"],
            None,
        );
        ok(&out);
    }
    // a damaged checkpoint is refused naming the field
    let bad = dir.join("ct");
    let cfg_path = bad.join("config.json");
    let cfg = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(
        &cfg_path,
        cfg.replace("\"float-quantized\"", "\"pack-quantized\""),
    )
    .unwrap();
    let out = support::generate(None, bad.to_str().unwrap(), &["hi"], None);
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("quantization_config.format"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // quantize refuses a non-empty output and a bad scale
    let again = lamina(&["quantize", src, "--out", dir.join("fp8").to_str().unwrap()]);
    assert!(!again.status.success() && stderr(&again).contains("not empty"));
    let neg = lamina(&[
        "quantize",
        src,
        "--out",
        dir.join("x").to_str().unwrap(),
        "--input-scale",
        "-1",
    ]);
    assert!(
        !neg.status.success() && stderr(&neg).contains("positive"),
        "{}",
        stderr(&neg)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// SmolLM2-135M-Instruct's real weights: FP8 (quantised at load, one scale
/// per row) close to BF16's perplexity on the shipped text. Measured: 26.19
/// BF16, 26.69 FP8 (+1.9%; Q8_0 +0.2%), 27.17 with the LM head in FP8 too
/// (+3.7%): e4m3 keeps 3 mantissa bits, and a model this small feels it;
/// the bounds hold those figures, not better.
#[test]
fn smollm2_fp8_perplexity_is_within_two_and_a_half_percent_of_bf16() {
    let m = "smollm2-135m-instruct";
    let bf16 = perplexity(m, "bf16", &[]);
    let fp8 = perplexity(m, "fp8", &[]);
    let head = perplexity(m, "fp8", &["--quantize-lm-head"]);
    eprintln!("SmolLM2 perplexity: bf16 {bf16:.4}, fp8 {fp8:.4}, fp8 + LM head {head:.4}");
    assert!(
        bf16.is_finite() && bf16 > 1.0 && bf16 < 100.0,
        "bf16 {bf16}"
    );
    assert!((fp8 / bf16 - 1.0).abs() < 0.025, "fp8 {fp8} vs bf16 {bf16}");
    // the head's rounding moves the figure: it is used, and costs little
    assert!(
        head != fp8 && (head / bf16 - 1.0).abs() < 0.05,
        "{head} vs {bf16}"
    );
}

#[test]
fn quantize_lm_head_without_fp8_weights_is_refused_naming_the_flag() {
    let out = lamina(&[
        "generate",
        "--device",
        "cpu",
        "--dtype",
        "bf16",
        "--quantize-lm-head",
        "--max-tokens",
        "1",
        "Hi",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--quantize-lm-head") && err.contains("--dtype fp8"),
        "{err}"
    );
}

/// SmolLM2-135M-Instruct's real weights with an FP8 KV cache (e4m3, scale
/// 1): within 1% of the BF16 cache's perplexity, with BF16 weights and with
/// FP8 ones. Measured: 26.19 (bf16 K/V) against 26.32 (fp8, +0.5%); FP8
/// weights 26.69 against 26.85 (+0.6%); f32 K/V 26.19.
#[test]
fn smollm2_fp8_kv_cache_perplexity_is_within_one_percent_of_bf16() {
    for weights in ["bf16", "fp8"] {
        let kv = |dtype: &str| {
            perplexity(
                "smollm2-135m-instruct",
                weights,
                &["--kv-cache-dtype", dtype],
            )
        };
        let (bf16, fp8) = (kv("bf16"), kv("fp8"));
        eprintln!("SmolLM2 {weights} weights, perplexity: bf16 K/V {bf16:.4}, fp8 K/V {fp8:.4}");
        assert!(
            bf16.is_finite() && bf16 > 1.0 && bf16 < 100.0,
            "bf16 {bf16}"
        );
        assert!(
            (fp8 / bf16 - 1.0).abs() < 0.01,
            "{weights} weights: fp8 K/V {fp8} vs bf16 K/V {bf16}"
        );
    }
}
