//! FP8 weights from the command line: `lamina quantize` writes the hub's
//! layouts, rounded to nearest or calibrated by GPTQ (`--calibration`),
//! the CPU runs them (dequantised) and refuses damaged ones by name, and on
//! SmolLM2's real weights FP8 costs under 2.5% of perplexity on the shipped
//! English text, against BF16 (under 5% with the LM head in FP8 too), and
//! under 1% when calibrated by GPTQ on another text, with a BF16 or an FP8
//! KV cache; an FP8 KV cache under 1% against a BF16 one, on a held-out
//! text too at calibrated K/V scales.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

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

/// The calibration text: English prose on another subject than [`text`].
fn calibration() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/text/calibration.txt")
}

/// The KV cache of every baseline, named so the tests share its runs.
const BF16_KV: &[&str] = &["--kv-cache-dtype", "bf16"];

/// `lamina perplexity --score-all ... --json`'s figure on the shipped text
/// (every token scored: a steadier comparison than llama-perplexity's
/// second halves).
fn perplexity(model: &str, dtype: &str, extra: &[&str]) -> f64 {
    perplexity_of(model, dtype, &text(), extra)
}

/// `lamina perplexity --score-all ... --json`'s figure on `t`, measured
/// once a process for the same arguments: several tests hold a format to
/// the same BF16 baseline.
fn perplexity_of(model: &str, dtype: &str, t: &Path, extra: &[&str]) -> f64 {
    type Figures = Mutex<HashMap<Vec<String>, Arc<OnceLock<f64>>>>;
    static MEASURED: OnceLock<Figures> = OnceLock::new();
    let key: Vec<String> = [model, dtype, t.to_str().unwrap()]
        .into_iter()
        .chain(extra.iter().copied())
        .map(String::from)
        .collect();
    let cell = {
        let mut figures = MEASURED.get_or_init(Default::default).lock().unwrap();
        figures.entry(key).or_default().clone()
    };
    *cell.get_or_init(|| measure_perplexity(model, dtype, t, extra))
}

fn measure_perplexity(model: &str, dtype: &str, t: &Path, extra: &[&str]) -> f64 {
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
        "--score-all",
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
        cfg.replace("\"float-quantized\"", "\"marlin-24\""),
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
    let bf16 = perplexity(m, "bf16", BF16_KV);
    let fp8 = perplexity(m, "fp8", BF16_KV);
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
fn fp8_flags_without_fp8_weights_are_refused_naming_the_flag() {
    for flag in ["--quantize-lm-head", "--fp8-activations"] {
        let out = lamina(&[
            "generate",
            "--device",
            "cpu",
            "--dtype",
            "bf16",
            flag,
            "--max-tokens",
            "1",
            "Hi",
        ]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{flag}: {err}");
        assert!(err.contains(flag) && err.contains("--dtype fp8"), "{err}");
    }
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

/// A text the repository does not ship: the GPL version 3 from Debian's
/// base-files (on every Debian machine), 7,624 SmolLM2 tokens.
const HELD_OUT: &str = "/usr/share/common-licenses/GPL-3";

/// SmolLM2-135M-Instruct's BF16 weights with the K/V scales `lamina
/// quantize --kv-scales --weight-dtype bf16` calibrates on another text: on
/// the held-out text, an FP8 KV cache (keys Hadamard-rotated at these
/// scales) within 1% of the BF16 cache's perplexity. Measured: 22.3579
/// (bf16 K/V) against 22.4512 (fp8, +0.42%; +1.25% unrotated).
#[test]
fn smollm2_fp8_kv_cache_at_calibrated_scales_is_within_one_percent_on_a_held_out_text() {
    let held_out = Path::new(HELD_OUT);
    if !held_out.is_file() {
        eprintln!(
            "SKIPPED smollm2_fp8_kv_cache_at_calibrated_scales_is_within_one_percent_on_a_held_out_text: no {HELD_OUT}"
        );
        return;
    }
    let dir = scratch("kv-held-out");
    let out = dir.join("bf16-kv-scales");
    let cal = calibration();
    ok(&lamina(&[
        "quantize",
        "smollm2-135m-instruct",
        "--out",
        out.to_str().unwrap(),
        "--calibration",
        cal.to_str().unwrap(),
        "--kv-scales",
        "--weight-dtype",
        "bf16",
    ]));
    let kv = |dtype: &str| {
        perplexity_of(
            out.to_str().unwrap(),
            "bf16",
            held_out,
            &["--kv-cache-dtype", dtype],
        )
    };
    let (bf16, fp8) = (kv("bf16"), kv("fp8"));
    eprintln!("SmolLM2 on {HELD_OUT}, perplexity: bf16 K/V {bf16:.4}, fp8 K/V {fp8:.4}");
    assert!(
        bf16.is_finite() && bf16 > 1.0 && bf16 < 100.0,
        "bf16 {bf16}"
    );
    assert!(
        (fp8 / bf16 - 1.0).abs() < 0.01,
        "fp8 K/V {fp8} vs bf16 K/V {bf16}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lamina quantize --calibration` on the tiny model: every layout's
/// checkpoint runs, and its weights are not the rounded ones.
#[test]
fn calibrated_checkpoints_run_on_the_cpu() {
    let dir = scratch("gptq");
    let src = support::synth_tiny(&dir, "bf16");
    let (src, cal) = (src.to_str().unwrap(), calibration());
    let rtn = dir.join("rtn");
    ok(&lamina(&["quantize", src, "--out", rtn.to_str().unwrap()]));
    for (name, extra) in [
        ("ct", vec![]),
        ("ct-tensor", vec!["--per-tensor", "--act-order"]),
        (
            "fp8",
            vec!["--layout", "fp8", "--calibration-tokens", "300"],
        ),
    ] {
        let out_dir = dir.join(name);
        let mut args = vec!["quantize", src, "--out", out_dir.to_str().unwrap()];
        args.extend(["--calibration", cal.to_str().unwrap()]);
        args.extend(extra);
        ok(&lamina(&args));
        let out = support::generate(
            None,
            out_dir.to_str().unwrap(),
            &["--max-tokens", "4", "--temperature", "0", "hi"],
            None,
        );
        ok(&out);
    }
    let weights = |d: &str| std::fs::read(dir.join(d).join("model.safetensors")).unwrap();
    assert_ne!(weights("ct"), weights("rtn"), "GPTQ moved some weights");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lamina quantize --kv-scales` on the tiny model: FP8 or BF16 weights
/// with each layer's calibrated `k_scale` / `v_scale` (not 1), which the
/// CPU runs with an FP8 KV cache; the flags it needs are refused by name
/// without them.
#[test]
fn kv_scales_are_calibrated_with_fp8_or_bf16_weights() {
    let dir = scratch("kv-scales");
    let src = support::synth_tiny(&dir, "bf16");
    let (src, cal) = (src.to_str().unwrap(), calibration());
    for (name, extra) in [("fp8", vec![]), ("bf16", vec!["--weight-dtype", "bf16"])] {
        let out_dir = dir.join(format!("kv-{name}"));
        let mut args = vec!["quantize", src, "--out", out_dir.to_str().unwrap()];
        args.extend(["--calibration", cal.to_str().unwrap(), "--kv-scales"]);
        args.extend(extra);
        ok(&lamina(&args));
        let st = std::fs::read(out_dir.join("model.safetensors")).unwrap();
        let header = String::from_utf8_lossy(&st[..st.len().min(1 << 16)]).into_owned();
        for n in [
            "model.layers.0.self_attn.k_scale",
            "model.layers.1.self_attn.v_scale",
        ] {
            assert!(header.contains(n), "{name}: no {n}");
        }
        assert_eq!(
            header.contains("F8_E4M3"),
            name == "fp8",
            "{name}: the weights' dtype"
        );
        let out = support::generate(
            None,
            out_dir.to_str().unwrap(),
            &[
                "--max-tokens",
                "4",
                "--temperature",
                "0",
                "--kv-cache-dtype",
                "fp8",
                "hi",
            ],
            None,
        );
        ok(&out);
    }
    for (args, needle) in [
        (vec!["--weight-dtype", "bf16"], "--kv-scales"),
        (vec!["--kv-scales"], "--calibration"),
    ] {
        let out = dir.join("refused");
        let mut all = vec!["quantize", src, "--out", out.to_str().unwrap()];
        all.extend(args.iter().copied());
        let r = lamina(&all);
        let err = stderr(&r);
        assert!(
            !r.status.success() && err.contains(needle),
            "{args:?}: {err}"
        );
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What `--calibration` cannot use is refused naming the flag or the file
/// before any weight loads, never with a panic.
#[test]
fn bad_calibration_input_is_refused_naming_the_flag() {
    let dir = scratch("gptq-bad");
    let src = support::synth_tiny(&dir, "bf16");
    let src = src.to_str().unwrap();
    let fp8 = dir.join("fp8");
    ok(&lamina(&["quantize", src, "--out", fp8.to_str().unwrap()]));
    let (empty, short) = (dir.join("empty.txt"), dir.join("short.txt"));
    std::fs::write(&empty, " \n").unwrap();
    std::fs::write(&short, "Too short to calibrate on.").unwrap();
    let (cal, missing) = (calibration(), dir.join("missing.txt"));
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    let p = |f: &PathBuf| f.to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (
            vec![src.into(), "--calibration".into(), p(&missing)],
            vec!["--calibration", "missing.txt"],
        ),
        (
            vec![src.into(), "--calibration".into(), p(&empty)],
            vec!["--calibration", "empty.txt", "empty"],
        ),
        (
            vec![src.into(), "--calibration".into(), p(&short)],
            vec!["--calibration", "short.txt", "at least 256"],
        ),
        (
            vec![p(&fp8), "--calibration".into(), p(&cal)],
            vec!["--calibration", "quantised checkpoint already"],
        ),
        (
            vec![src.into(), "--calibration-tokens".into(), "512".into()],
            vec!["--calibration"],
        ),
        (
            vec![
                src.into(),
                "--calibration".into(),
                p(&cal),
                "--calibration-tokens".into(),
                "10".into(),
            ],
            vec!["--calibration-tokens", "10"],
        ),
        (
            vec![
                src.into(),
                "--calibration".into(),
                p(&cal),
                "--dampening".into(),
                "-1".into(),
            ],
            vec!["--dampening"],
        ),
    ];
    for (args, needles) in cases {
        let mut all = vec!["quantize", "--out", o];
        all.extend(args.iter().map(String::as_str));
        let r = lamina(&all);
        let err = stderr(&r);
        assert!(!r.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: `{err}` should name `{n}`");
        }
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SmolLM2-135M-Instruct quantised by GPTQ over the shipped calibration
/// text (2,048 tokens, another subject than the scored text), with
/// calibrated K/V scales: the weights within 1% of BF16's perplexity, the
/// FP8 KV cache within 1% of a BF16 one on those weights. Measured (AVX-512
/// / AVX2): 26.19 BF16, 26.35 GPTQ (+0.6%; rounding to nearest +1.9%),
/// 26.49 / 26.51 with FP8 K/V (+0.5% / +0.6% of GPTQ's, +1.2% of BF16's),
/// 26.67 with FP8 activations (W8A8, +1.8%). Other calibration settings
/// land between +0.2% and +0.9% (the 1,866 scored tokens move by a few
/// tenths of a percent with any change of the weights' rounding).
#[test]
fn smollm2_gptq_fp8_weights_and_fp8_kv_each_cost_under_one_percent() {
    let dir = scratch("gptq-smollm2");
    let (cal, out) = (calibration(), dir.join("gptq"));
    ok(&lamina(&[
        "quantize",
        "smollm2-135m-instruct",
        "--out",
        out.to_str().unwrap(),
        "--calibration",
        cal.to_str().unwrap(),
        "--kv-scales",
    ]));
    let bf16 = perplexity("smollm2-135m-instruct", "bf16", BF16_KV);
    let m = out.to_str().unwrap();
    let gptq = perplexity(m, "auto", &[]);
    let kv = perplexity(m, "auto", &["--kv-cache-dtype", "fp8"]);
    let w8a8 = perplexity(m, "auto", &["--fp8-activations"]);
    eprintln!(
        "SmolLM2 perplexity: bf16 {bf16:.4}, gptq fp8 {gptq:.4}, with fp8 K/V {kv:.4}, \
         with fp8 activations {w8a8:.4}"
    );
    // W8A8 is not held to 1%: rounding the activations to e4m3 costs this
    // model about as much again as the weights (docs/performance.md)
    assert!(
        w8a8 != gptq && (w8a8 / bf16 - 1.0).abs() < 0.04,
        "gptq + fp8 activations {w8a8} vs bf16 {bf16}"
    );
    assert!(
        bf16.is_finite() && bf16 > 1.0 && bf16 < 100.0,
        "bf16 {bf16}"
    );
    // each format within 1% of what it replaces: the weights against
    // BF16's, the K/V cache (calibrated scales, rotated keys) against BF16
    // K/V on the same weights; together within the sum of the two
    assert!(
        (gptq / bf16 - 1.0).abs() < 0.01,
        "gptq {gptq} vs bf16 {bf16}"
    );
    assert!(
        (kv / gptq - 1.0).abs() < 0.01,
        "gptq + fp8 K/V {kv} vs gptq {gptq}"
    );
    assert!(
        (kv / bf16 - 1.0).abs() < 0.02,
        "gptq + fp8 K/V {kv} vs bf16 {bf16}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
