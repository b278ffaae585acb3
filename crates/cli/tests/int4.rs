//! 4-bit weights from the command line: `lamina quantize --format int4`
//! writes GPTQ's layout rounded to nearest or calibrated by GPTQ
//! (`--calibration`), the CPU runs both, and the FP8-only flags are
//! refused by name before anything is written.

mod support;

use std::path::{Path, PathBuf};

use support::{lamina, ok, stderr};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lamina-int4-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The calibration text (English prose).
fn calibration() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/text/calibration.txt")
}

/// The safetensors header of `dir`'s model (the tensor names and dtypes).
fn header(dir: &Path) -> String {
    let st = std::fs::read(dir.join("model.safetensors")).unwrap();
    let len = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    String::from_utf8_lossy(&st[8..8 + len]).into_owned()
}

/// `lamina quantize --format int4` on the tiny model, rounded, with
/// `--calibration` and with `--act-order` too: every checkpoint is GPTQ's
/// layout (`desc_act` with the activation order), loads and runs on the
/// CPU, and GPTQ moved some codes.
#[test]
fn calibrated_int4_checkpoints_run_on_the_cpu() {
    let dir = scratch("gptq");
    let src = support::synth_tiny(&dir, "bf16");
    let (src, cal) = (src.to_str().unwrap(), calibration());
    let base = ["--format", "int4", "--group-size", "32"];
    for (name, extra) in [
        ("rtn", vec![]),
        (
            "gptq",
            vec![
                "--calibration",
                cal.to_str().unwrap(),
                "--calibration-tokens",
                "300",
            ],
        ),
        (
            "gptq-act-order",
            vec![
                "--calibration",
                cal.to_str().unwrap(),
                "--calibration-tokens",
                "300",
                "--act-order",
            ],
        ),
    ] {
        let out_dir = dir.join(name);
        let mut args = vec!["quantize", src, "--out", out_dir.to_str().unwrap()];
        args.extend(base);
        args.extend(extra);
        ok(&lamina(&args));
        let cfg = std::fs::read_to_string(out_dir.join("config.json")).unwrap();
        assert!(cfg.contains(r#""quant_method": "gptq""#), "{name}: {cfg}");
        assert!(cfg.contains(r#""group_size": 32"#), "{name}: {cfg}");
        let desc_act = format!(r#""desc_act": {}"#, name == "gptq-act-order");
        assert!(cfg.contains(&desc_act), "{name}: {cfg}");
        let h = header(&out_dir);
        assert!(
            h.contains("model.layers.1.mlp.down_proj.qweight") && !h.contains("down_proj.weight"),
            "{name}: {h}"
        );
        let out = support::generate(
            None,
            out_dir.to_str().unwrap(),
            &["--max-tokens", "4", "--temperature", "0", "hi"],
            None,
        );
        ok(&out);
    }
    let weights = |d: &str| std::fs::read(dir.join(d).join("model.safetensors")).unwrap();
    assert_ne!(weights("gptq"), weights("rtn"), "GPTQ moved some codes");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--kv-scales` does not apply to the 4-bit layout written: refused
/// naming the flag, nothing written.
#[test]
fn kv_scales_are_refused_with_int4() {
    let dir = scratch("flags");
    let src = support::synth_tiny(&dir, "bf16");
    let (src, cal) = (src.to_str().unwrap(), calibration());
    let out = dir.join("out");
    let r = lamina(&[
        "quantize",
        src,
        "--out",
        out.to_str().unwrap(),
        "--format",
        "int4",
        "--group-size",
        "32",
        "--calibration",
        cal.to_str().unwrap(),
        "--kv-scales",
    ]);
    let err = stderr(&r);
    assert!(!r.status.success(), "--kv-scales succeeded");
    assert!(
        err.contains("--kv-scales") && err.contains("--format fp8"),
        "{err}"
    );
    assert!(!out.exists(), "--kv-scales wrote {}", out.display());
    let _ = std::fs::remove_dir_all(&dir);
}
