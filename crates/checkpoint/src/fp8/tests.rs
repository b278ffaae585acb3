use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use tempfile::TempDir;

use super::*;
use crate::loader::{LoadError, load_config, load_weights};
use crate::synth::{Preset, synth_model};

/// A tiny BF16 model (seed 4) in a fresh temp dir.
fn tiny() -> (TempDir, PathBuf) {
    let d = TempDir::new().unwrap();
    let src = d.path().join("bf16");
    synth_model(Preset::Tiny, 4, &src).unwrap();
    (d, src)
}

fn convert(src: &Path, name: &str, opts: Fp8Options) -> PathBuf {
    let out = src.parent().unwrap().join(name);
    write_fp8_checkpoint(src, &out, opts).unwrap();
    out
}

const CHANNEL: Fp8Options = Fp8Options {
    layout: Fp8Layout::CompressedTensors,
    channel: true,
    input_scale: None,
};

fn load(dir: &Path) -> Result<ModelWeights, LoadError> {
    let cfg = load_config(dir)?.config;
    load_weights(dir, &cfg)
}

/// `p`'s FP8 tensor (the test's model has FP8 projections).
fn fp8_of(p: &Projection) -> &Fp8Tensor {
    match p {
        Projection::Fp8(f) => f,
        other => panic!("`{}` is {}, not FP8", other.name(), other.format()),
    }
}

fn fp8_mut(p: &mut Projection) -> &mut Fp8Tensor {
    match p {
        Projection::Fp8(f) => f,
        other => panic!("`{}` is {}, not FP8", other.name(), other.format()),
    }
}

fn bf16_of(p: &Projection) -> &Tensor {
    p.as_bf16().expect("a BF16 projection")
}

/// Every layout round-trips: the FP8 bytes and scales come back, their
/// dequantised values within e4m3's precision of the source, and the rest
/// is the source unchanged.
#[test]
fn every_layout_loads_back_what_was_written() {
    let (_d, src) = tiny();
    let orig = load(&src).unwrap();
    let layouts = [
        ("ct-channel", CHANNEL),
        (
            "ct-tensor-static",
            Fp8Options {
                channel: false,
                input_scale: Some(0.02),
                ..CHANNEL
            },
        ),
        (
            "fp8-static",
            Fp8Options {
                layout: Fp8Layout::Fp8,
                channel: false,
                input_scale: Some(0.5),
            },
        ),
        (
            "fp8-dynamic",
            Fp8Options {
                layout: Fp8Layout::Fp8,
                channel: false,
                input_scale: None,
            },
        ),
    ];
    for (name, opts) in layouts {
        let dir = convert(&src, name, opts);
        let w = load(&dir).unwrap();
        assert!(w.is_fp8(), "{name}");
        assert_eq!(w.embed, orig.embed, "{name}");
        assert_eq!(w.norm, orig.norm, "{name}");
        for (a, b) in w.layers.iter().zip(&orig.layers) {
            assert_eq!(a.input_norm, b.input_norm);
            for p in a.projections() {
                assert_eq!(p.format(), crate::Format::Fp8Row, "{name}");
            }
            for (src, q) in [
                (bf16_of(&b.q_proj), fp8_of(&a.q_proj)),
                (bf16_of(&b.down_proj), fp8_of(&a.down_proj)),
            ] {
                let deq = q.dequantize();
                assert_eq!(q.scale.len(), src.shape[0], "{name}: one scale per row");
                if !opts.channel {
                    assert!(q.scale.iter().all(|s| *s == q.scale[0]), "{name}");
                }
                assert_eq!(
                    q.input_scale.is_some(),
                    opts.input_scale.is_some(),
                    "{name}"
                );
                let amax = src.to_f32().iter().fold(0f32, |m, v| m.max(v.abs()));
                for (x, y) in src.to_f32().iter().zip(deq.to_f32()) {
                    assert!(
                        (x - y).abs() <= x.abs() / 12.0 + amax / 448.0,
                        "{name}: {x} vs {y}"
                    );
                }
            }
        }
    }
}

/// Quantising a BF16 model at load gives what the per-channel converter
/// writes.
#[test]
fn quantising_at_load_matches_the_per_channel_checkpoint() {
    let (_d, src) = tiny();
    let mut at_load = load(&src).unwrap();
    at_load.quantize_fp8();
    let from_file = load(&convert(&src, "ct", CHANNEL)).unwrap();
    for (x, y) in at_load.layers.iter().zip(&from_file.layers) {
        let (x, y) = (fp8_of(&x.gate_proj), fp8_of(&y.gate_proj));
        assert_eq!(x.data, y.data);
        // the checkpoint stores scales in bf16
        for (s, t) in x.scale.iter().zip(&y.scale) {
            assert!((s - t).abs() <= s * 1e-2, "{s} vs {t}");
        }
    }
}

/// Projections given already quantised (GPTQ's) are written as they are,
/// in either scale layout, and come back bit for bit; ones that do not fit
/// the model or the layout are refused naming the tensor; the store's
/// `lamina.json` is not copied.
#[test]
fn given_projections_are_written_as_they_are() {
    let (_d, src) = tiny();
    std::fs::write(src.join("lamina.json"), r#"{"gguf": "x.gguf"}"#).unwrap();
    let orig = load(&src).unwrap();
    let mut fp8 = orig.clone();
    fp8.quantize_fp8();
    // another rounding than the converter's: one bit off, a BF16 scale
    fp8_mut(&mut fp8.layers[1].down_proj).data[3] ^= 1;
    fp8_mut(&mut fp8.layers[1].down_proj).scale[0] = 0.0078125;
    let out = src.parent().unwrap().join("given");
    write_quantized_checkpoint(&src, &fp8, &out, CHANNEL).unwrap();
    assert!(!out.join("lamina.json").exists());
    let back = load(&out).unwrap();
    let b = fp8_of(&back.layers[1].down_proj);
    assert_eq!(b.data, fp8_of(&fp8.layers[1].down_proj).data);
    // (stored as BF16, as llm-compressor does)
    assert_eq!(b.scale[0], 0.0078125);
    // one scale per tensor: all rows the same, written once
    let per_tensor = Fp8Options {
        channel: false,
        ..CHANNEL
    };
    let mut same = fp8.clone();
    for l in &mut same.layers {
        for (i, p) in l.projections_mut().into_iter().enumerate() {
            fp8_mut(p).scale.fill(if i < 4 { 0.5 } else { 0.25 });
        }
    }
    let out = src.parent().unwrap().join("given-tensor");
    write_quantized_checkpoint(&src, &same, &out, per_tensor).unwrap();
    let back = load(&out).unwrap();
    assert_eq!(
        fp8_of(&back.layers[0].up_proj).data,
        fp8_of(&same.layers[0].up_proj).data
    );
    let scratch = src.parent().unwrap().join("refused");
    let err = write_quantized_checkpoint(&src, &fp8, &scratch, per_tensor).unwrap_err();
    assert!(err.to_string().contains("one per tensor"), "{err}");
    let mut short = fp8.clone();
    fp8_mut(&mut short.layers[0].k_proj).scale.pop();
    let err = write_quantized_checkpoint(&src, &short, &scratch, CHANNEL).unwrap_err();
    assert!(
        err.to_string().contains("model.layers.0.self_attn.k_proj"),
        "{err}"
    );
    let mut fewer = fp8.clone();
    fewer.layers.pop();
    let err = write_quantized_checkpoint(&src, &fewer, &scratch, CHANNEL).unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
    assert!(
        !scratch.exists(),
        "nothing is written before the checks pass"
    );
}

/// `--quantize-lm-head`: only with FP8 projections; a tied head gets its
/// own e4m3 copy named `lm_head.weight`, one scale per vocabulary row (the
/// embedding stays exact).
#[test]
fn the_lm_head_quantises_only_beside_fp8_projections() {
    let (_d, src) = tiny();
    let mut w = load(&src).unwrap();
    w.lm_head = None; // tied to the embedding, as Llama 3.2 1B's
    let embed = w.embed.clone();
    assert!(w.quantize_lm_head_fp8().is_none());
    assert!(w.lm_head.is_none() && !w.is_fp8());
    w.quantize_fp8();
    assert!(w.lm_head.is_none());
    w.quantize_lm_head_fp8().unwrap();
    let head = w.lm_head.clone().unwrap();
    let f = fp8_of(&head);
    assert_eq!(f.name, "lm_head.weight");
    assert_eq!(f.shape, embed.shape);
    assert_eq!(f.scale.len(), embed.shape[0]);
    assert_eq!(w.embed, embed);
    let dense = head.dense().unwrap();
    assert_eq!(dense.data, f.dequantize().data);
    assert_ne!(dense.data, embed.data, "the head holds the rounded values");
    // a second call changes nothing
    w.quantize_lm_head_fp8().unwrap();
    assert_eq!(w.lm_head.as_ref(), Some(&head));
}

/// Rewrites `dir`'s weights through `edit` (name -> dtype, shape, bytes).
fn rewrite(dir: &Path, edit: impl FnOnce(&mut HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>)) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut all: HashMap<String, (Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    edit(&mut all);
    let views: Vec<(String, TensorView<'_>)> = all
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
}

/// Edits `config.json`'s `quantization_config`.
fn reconfigure(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v["quantization_config"]);
    std::fs::write(&path, v.to_string()).unwrap();
}

fn refused(dir: &Path, needles: &[&str]) {
    let err = load(dir).expect_err("must be refused").to_string();
    for n in needles {
        assert!(err.contains(n), "`{err}` should name `{n}`");
    }
}

const Q: &str = "model.layers.1.self_attn.q_proj";

/// Bad scales are refused naming the tensor and what is wrong.
#[test]
fn bad_scales_are_refused_naming_the_tensor() {
    let (_d, src) = tiny();
    type Edit = Box<dyn FnOnce(&mut HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>)>;
    let cases: Vec<(&str, Edit, Vec<&str>)> = vec![
        (
            "missing",
            Box::new(|m| drop(m.remove(&format!("{Q}.weight_scale")))),
            vec!["weight_scale", "missing"],
        ),
        (
            "shape",
            Box::new(|m| {
                let e = m.get_mut(&format!("{Q}.weight_scale")).unwrap();
                e.1 = vec![e.1[0] / 2, 2];
            }),
            vec!["weight_scale", "shape"],
        ),
        (
            "nan",
            Box::new(|m| {
                let e = m.get_mut(&format!("{Q}.weight_scale")).unwrap();
                e.2[2..4].copy_from_slice(&half::bf16::NAN.to_bits().to_le_bytes());
            }),
            vec!["weight_scale", "NaN", "index 1"],
        ),
        (
            "zero",
            Box::new(|m| {
                let e = m.get_mut(&format!("{Q}.weight_scale")).unwrap();
                e.2[0..2].fill(0);
            }),
            vec!["weight_scale", "positive"],
        ),
        (
            "dtype",
            Box::new(|m| {
                let e = m.get_mut(&format!("{Q}.weight_scale")).unwrap();
                e.0 = Dtype::I16;
            }),
            vec!["weight_scale", "I16"],
        ),
    ];
    for (name, edit, needles) in cases {
        let dir = convert(&src, name, CHANNEL);
        rewrite(&dir, edit);
        let mut all = needles.clone();
        all.push(Q);
        refused(&dir, &all);
    }
    // static activations need their input scale
    let dir = convert(
        &src,
        "static",
        Fp8Options {
            input_scale: Some(1.0),
            ..CHANNEL
        },
    );
    rewrite(&dir, |m| drop(m.remove(&format!("{Q}.input_scale"))));
    refused(&dir, &[Q, "input_scale", "static"]);
}

/// Layouts lamina does not run are refused naming the field.
#[test]
fn other_layouts_are_refused_naming_the_field() {
    let (_d, src) = tiny();
    type Case = (
        &'static str,
        Fp8Layout,
        fn(&mut serde_json::Value),
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "method",
            Fp8Layout::Fp8,
            |q| q["quant_method"] = "bitsandbytes".into(),
            "quantization_config.quant_method",
        ),
        (
            "block",
            Fp8Layout::Fp8,
            |q| q["weight_block_size"] = serde_json::json!([128, 128]),
            "weight_block_size",
        ),
        (
            "fmt",
            Fp8Layout::Fp8,
            |q| q["fmt"] = "e5m2".into(),
            "quantization_config.fmt",
        ),
        (
            "group",
            Fp8Layout::CompressedTensors,
            |q| q["config_groups"]["group_0"]["weights"]["strategy"] = "group".into(),
            "config_groups.group_0.weights.strategy",
        ),
        (
            "int",
            Fp8Layout::CompressedTensors,
            |q| q["config_groups"]["group_0"]["weights"]["type"] = "int".into(),
            "config_groups.group_0.weights.type",
        ),
        (
            "format",
            Fp8Layout::CompressedTensors,
            |q| q["format"] = "marlin-24".into(),
            "quantization_config.format",
        ),
    ];
    for (name, layout, edit, field) in cases {
        let dir = convert(
            &src,
            name,
            Fp8Options {
                layout,
                channel: layout == Fp8Layout::CompressedTensors,
                input_scale: None,
            },
        );
        reconfigure(&dir, edit);
        refused(&dir, &[field]);
    }
    // FP8 tensors without a quantization_config
    let dir = convert(&src, "noconfig", CHANNEL);
    reconfigure(&dir, |q| *q = serde_json::Value::Null);
    refused(&dir, &["quantization_config", "F8_E4M3"]);
}

/// The FP8 KV cache's per-layer scales (`k_scale` / `v_scale`, a scalar
/// each, compressed-tensors' `kv_cache_scheme`) are read when present, all
/// layers or none; a missing or bad one is refused naming the tensor.
#[test]
fn kv_cache_scales_are_read_and_checked() {
    let (_d, src) = tiny();
    let dir = convert(&src, "kv", CHANNEL);
    assert_eq!(load(&dir).unwrap().kv_scales, None, "none written");
    let layers = load_config(&dir).unwrap().config.num_layers;
    let scalar = |x: f32| (Dtype::F32, vec![], x.to_le_bytes().to_vec());
    rewrite(&dir, |m| {
        for l in 0..layers {
            let [k, v] = kv_scale_names(l);
            m.insert(k, scalar(0.5 + l as f32));
            m.insert(v, scalar(0.25));
        }
    });
    reconfigure(&dir, |q| {
        q["kv_cache_scheme"] = serde_json::json!({
            "num_bits": 8, "type": "float", "strategy": "tensor",
            "dynamic": false, "symmetric": true
        });
    });
    let w = load(&dir).unwrap();
    let s = w.kv_scales.as_ref().expect("scales read");
    assert_eq!(s.k, (0..layers).map(|l| 0.5 + l as f32).collect::<Vec<_>>());
    assert_eq!(s.v, vec![0.25; layers]);
    assert_eq!(w.kv_scales_or_ones().layer(1), (1.5, 0.25));
    // one layer's V scale missing
    let [_, v1] = kv_scale_names(1);
    let gone = convert(&src, "kv-gone", CHANNEL);
    rewrite(&gone, |m| {
        for l in 0..layers {
            let [k, v] = kv_scale_names(l);
            m.insert(k, scalar(1.0));
            if l != 1 {
                m.insert(v, scalar(1.0));
            }
        }
    });
    refused(&gone, &[&v1, "missing"]);
    // a non-positive one, and a KV scheme of another type
    rewrite(&dir, |m| drop(m.insert(v1.clone(), scalar(-1.0))));
    refused(&dir, &[&v1, "positive"]);
    rewrite(&dir, |m| drop(m.insert(v1.clone(), scalar(1.0))));
    reconfigure(&dir, |q| q["kv_cache_scheme"]["num_bits"] = 4.into());
    refused(&dir, &["kv_cache_scheme.num_bits"]);
}

/// `write_checkpoint` adds the KV cache scales to FP8 weights (BF16 `[1]`
/// and compressed-tensors' `kv_cache_scheme`; F32 scalars in the `fp8`
/// layout) and to BF16 ones (the weights and `config.json` as they were);
/// the loader reads them back, and a missing or bad scale is refused
/// naming the tensor before anything is written.
#[test]
fn kv_cache_scales_are_written_with_fp8_or_bf16_weights() {
    let (d, src) = tiny();
    let orig = load(&src).unwrap();
    let layers = orig.layers.len();
    let kv = contract::KvScales {
        k: (0..layers).map(|l| 0.5 * (l + 1) as f32).collect(),
        v: vec![0.0078125; layers],
    };
    let (fp8, fp8_tensor) = (rounded(&orig, false), rounded(&orig, true));
    let layout_fp8 = Fp8Options {
        layout: Fp8Layout::Fp8,
        channel: false,
        input_scale: None,
    };
    for (name, weights, how) in [
        ("ct", &fp8, WeightsOut::Fp8(CHANNEL)),
        ("fp8", &fp8_tensor, WeightsOut::Fp8(layout_fp8)),
        ("bf16", &orig, WeightsOut::Bf16),
    ] {
        let out = d.path().join(format!("kv-{name}"));
        write_checkpoint(&src, weights, how, &kv, &out).unwrap();
        let w = load(&out).unwrap();
        assert_eq!(w.kv_scales.as_ref(), Some(&kv), "{name}");
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        let q = &cfg["quantization_config"];
        match name {
            "ct" => assert_eq!(q["kv_cache_scheme"]["num_bits"], 8, "{cfg}"),
            "fp8" => assert!(w.is_fp8(), "{name}"),
            _ => {
                assert!(q.is_null() && !w.is_fp8(), "{cfg}");
                assert_eq!(w.layers, orig.layers, "BF16 weights as they were");
            }
        }
        let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let [k0, _] = kv_scale_names(0);
        let t = st.tensor(&k0).unwrap();
        let want = if name == "fp8" {
            (Dtype::F32, vec![])
        } else {
            (Dtype::BF16, vec![1])
        };
        assert_eq!((t.dtype(), t.shape().to_vec()), want, "{name}");
    }
    // a scale missing or not positive: refused by name, nothing written
    for (bad, tensor) in [
        (
            contract::KvScales {
                k: kv.k[..layers - 1].to_vec(),
                v: kv.v.clone(),
            },
            kv_scale_names(layers - 1)[0].clone(),
        ),
        (
            contract::KvScales {
                k: kv.k.clone(),
                v: vec![f32::NAN; layers],
            },
            kv_scale_names(0)[1].clone(),
        ),
    ] {
        let out = d.path().join("bad");
        let e = write_checkpoint(&src, &orig, WeightsOut::Bf16, &bad, &out).unwrap_err();
        assert!(e.to_string().contains(&tensor), "{e}");
        assert!(!out.exists());
    }
}

/// `w` with its projections rounded to nearest, per row or per tensor.
fn rounded(w: &ModelWeights, per_tensor: bool) -> ModelWeights {
    let q = |t: &Tensor| {
        if !per_tensor {
            return Fp8Tensor::quantize(t);
        }
        let n = t.shape[0];
        let (data, s) = ops::fp8::quantize_rows(&t.to_f32(), 1, t.numel());
        Fp8Tensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            data,
            scale: vec![s[0]; n],
            input_scale: None,
        }
    };
    let mut out = w.clone();
    for p in out.layers.iter_mut().flat_map(|l| l.projections_mut()) {
        *p = Projection::Fp8(q(bf16_of(p)));
    }
    out
}
