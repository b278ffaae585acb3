//! Loader tests: every failure names its file and tensor/field; sharded and
//! single-file loads agree; F16/F32 on disk convert to the same BF16.

use super::*;
use crate::synth::{Preset, synth_model};
use safetensors::tensor::TensorView;
use tempfile::TempDir;

/// A value exactly representable in BF16, F16 and F32 for element `i` of tensor `t`.
fn val(t: usize, i: usize) -> f32 {
    ((i * 7 + t * 3) % 17) as f32 / 16.0 - 0.5
}

fn tiny_cfg() -> ModelConfig {
    Preset::Tiny.config().unwrap()
}

/// Writes `config.json` (tiny preset, optionally edited) and weights from
/// `specs` in `dtype`, spread over `shards` files (index when > 1).
fn write_model(dir: &Path, config: &str, specs: &[TensorSpec], dtype: Dtype, shards: usize) {
    write_model_with(dir, config, specs, dtype, shards, &val)
}

/// [`write_model`] with element `i` of tensor `t` given by `value(t, i)`.
fn write_model_with(
    dir: &Path,
    config: &str,
    specs: &[TensorSpec],
    dtype: Dtype,
    shards: usize,
    value: &dyn Fn(usize, usize) -> f32,
) {
    std::fs::write(dir.join("config.json"), config).unwrap();
    let mut weight_map = serde_json::Map::new();
    let per = specs.len().div_ceil(shards);
    for (k, chunk) in specs.chunks(per).enumerate() {
        let file = if shards == 1 {
            SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", k + 1)
        };
        let bufs: Vec<(String, Vec<usize>, Vec<u8>)> = chunk
            .iter()
            .enumerate()
            .map(|(j, s)| {
                let t = k * per + j;
                let bytes = (0..s.numel())
                    .flat_map(|i| match dtype {
                        Dtype::BF16 => bf16::from_f32(value(t, i)).to_le_bytes().to_vec(),
                        Dtype::F16 => f16::from_f32(value(t, i)).to_le_bytes().to_vec(),
                        Dtype::F32 => value(t, i).to_le_bytes().to_vec(),
                        Dtype::I32 => (i as i32).to_le_bytes().to_vec(),
                        _ => unreachable!("test dtype"),
                    })
                    .collect();
                (s.name.clone(), s.shape.clone(), bytes)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = bufs
            .iter()
            .map(|(n, shape, b)| (n.clone(), TensorView::new(dtype, shape.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for s in chunk {
            weight_map.insert(s.name.clone(), file.clone().into());
        }
    }
    if shards > 1 {
        let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        std::fs::write(dir.join(INDEX_FILE), index.to_string()).unwrap();
    }
}

fn tiny_json() -> String {
    Preset::Tiny.config_json().to_string()
}

#[test]
fn missing_directory_is_named() {
    let err = load_config(Path::new("/nonexistent/lamina-model")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "model directory /nonexistent/lamina-model does not exist"
    );
    let err = load_weights(Path::new("/nonexistent/m"), &tiny_cfg()).unwrap_err();
    assert!(matches!(err, LoadError::MissingDir(_)), "{err}");
}

#[test]
fn malformed_config_names_file() {
    let d = TempDir::new().unwrap();
    std::fs::write(d.path().join("config.json"), "{\"hidden_size\": 64,").unwrap();
    let err = load_config(d.path()).unwrap_err().to_string();
    assert!(
        err.contains("malformed") && err.contains("config.json"),
        "{err}"
    );
    std::fs::write(
        d.path().join("config.json"),
        tiny_json().replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3"),
    )
    .unwrap();
    let err = load_config(d.path()).unwrap_err().to_string();
    assert!(
        err.contains("num_key_value_heads") && err.contains("config.json"),
        "{err}"
    );
}

#[test]
fn config_and_eos_from_generation_config() {
    let d = TempDir::new().unwrap();
    std::fs::write(d.path().join("config.json"), tiny_json()).unwrap();
    std::fs::write(
        d.path().join("generation_config.json"),
        r#"{"eos_token_id": [257, 5]}"#,
    )
    .unwrap();
    let m = load_config(d.path()).unwrap();
    assert_eq!(m.eos_ids, vec![257, 5]);
    assert_eq!(m.config, tiny_cfg());
}

#[test]
fn loads_all_dtypes_to_the_same_bf16_and_shards_agree() {
    let cfg = tiny_cfg();
    let specs = tensor_specs(&cfg, true);
    let mut loaded = Vec::new();
    for (dtype, shards) in [
        (Dtype::BF16, 1),
        (Dtype::F16, 1),
        (Dtype::F32, 1),
        (Dtype::BF16, 3),
    ] {
        let d = TempDir::new().unwrap();
        write_model(d.path(), &tiny_json(), &specs, dtype, shards);
        loaded.push(
            load_weights(d.path(), &cfg).unwrap_or_else(|e| panic!("{dtype:?}/{shards}: {e}")),
        );
    }
    let w = &loaded[0];
    assert_eq!(w.layers.len(), cfg.num_layers);
    assert_eq!(w.embed.shape, vec![cfg.vocab_size, cfg.hidden_size]);
    assert_eq!(w.layers[1].k_proj.shape(), [cfg.kv_dim(), cfg.hidden_size]);
    let t = specs
        .iter()
        .position(|s| s.name == "model.layers.1.self_attn.k_proj.weight")
        .unwrap();
    let k = w.layers[1].k_proj.as_bf16().expect("a BF16 checkpoint");
    assert_eq!(k.data[5].to_f32(), val(t, 5));
    assert!(w.lm_head.is_some());
    for other in &loaded[1..] {
        assert!(other == w);
    }
}

#[test]
fn tied_head_is_none_and_present_head_is_used() {
    let d = TempDir::new().unwrap();
    let json = tiny_json().replace(
        "\"tie_word_embeddings\":false",
        "\"tie_word_embeddings\":true",
    );
    let cfg = ModelConfig::from_json(&json, "c").unwrap();
    write_model(d.path(), &json, &tensor_specs(&cfg, false), Dtype::BF16, 1);
    assert!(load_weights(d.path(), &cfg).unwrap().lm_head.is_none());
    write_model(d.path(), &json, &tensor_specs(&cfg, true), Dtype::BF16, 1);
    assert!(load_weights(d.path(), &cfg).unwrap().lm_head.is_some());
}

#[test]
fn missing_tensor_names_file_and_tensor() {
    let d = TempDir::new().unwrap();
    let cfg = tiny_cfg();
    let specs: Vec<_> = tensor_specs(&cfg, true)
        .into_iter()
        .filter(|s| s.name != "lm_head.weight")
        .collect();
    write_model(d.path(), &tiny_json(), &specs, Dtype::BF16, 1);
    let err = load_weights(d.path(), &cfg).unwrap_err().to_string();
    assert!(
        err.contains("`lm_head.weight`") && err.contains(SINGLE_FILE),
        "{err}"
    );
    // sharded: the index names no shard for it
    let d = TempDir::new().unwrap();
    let specs: Vec<_> = tensor_specs(&cfg, true)
        .into_iter()
        .filter(|s| s.name != "model.layers.2.mlp.up_proj.weight")
        .collect();
    write_model(d.path(), &tiny_json(), &specs, Dtype::BF16, 2);
    let err = load_weights(d.path(), &cfg).unwrap_err().to_string();
    assert!(
        err.contains("model.layers.2.mlp.up_proj.weight") && err.contains(INDEX_FILE),
        "{err}"
    );
}

/// One NaN in a layer's `down_proj` (or an
/// infinity anywhere) is refused at load with the tensor named, never served.
#[test]
fn non_finite_weights_are_refused_naming_the_tensor() {
    let cfg = tiny_cfg();
    let specs = tensor_specs(&cfg, true);
    let target = "model.layers.1.mlp.down_proj.weight";
    let t = specs.iter().position(|s| s.name == target).unwrap();
    for (bad, dtype, shards, what) in [
        (f32::NAN, Dtype::BF16, 1, "NaN"),
        (f32::INFINITY, Dtype::F32, 2, "inf"),
        (f32::NEG_INFINITY, Dtype::F16, 1, "-inf"),
    ] {
        let d = TempDir::new().unwrap();
        let value = |tt: usize, i: usize| if tt == t && i == 37 { bad } else { val(tt, i) };
        write_model_with(d.path(), &tiny_json(), &specs, dtype, shards, &value);
        let err = load_weights(d.path(), &cfg).unwrap_err();
        assert!(
            matches!(err, LoadError::NonFinite { index: 37, .. }),
            "{err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(target) && msg.contains(what), "{msg}");
    }
    // the clean model loads
    let d = TempDir::new().unwrap();
    write_model(d.path(), &tiny_json(), &specs, Dtype::BF16, 1);
    assert!(load_weights(d.path(), &cfg).is_ok());
}

/// Finite but absurd weights (anywhere past the plausible magnitude, in a
/// projection or a norm) are refused at load naming the tensor, the value
/// and the limit; a large but plausible one loads.
#[test]
fn absurdly_large_weights_are_refused_naming_the_tensor() {
    let cfg = tiny_cfg();
    let specs = tensor_specs(&cfg, true);
    for (target, bad, dtype) in [
        ("model.layers.1.mlp.down_proj.weight", 1e7f32, Dtype::BF16),
        ("model.layers.0.self_attn.q_proj.weight", -3e4, Dtype::F32),
        ("model.norm.weight", 2e4, Dtype::BF16),
        ("model.embed_tokens.weight", 1e38, Dtype::F32),
    ] {
        let t = specs.iter().position(|s| s.name == target).unwrap();
        let d = TempDir::new().unwrap();
        let value = |tt: usize, i: usize| if tt == t && i == 5 { bad } else { val(tt, i) };
        write_model_with(d.path(), &tiny_json(), &specs, dtype, 1, &value);
        let err = load_weights(d.path(), &cfg).unwrap_err();
        assert!(
            matches!(err, LoadError::Implausible { index: 5, .. }),
            "{err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(target) && msg.contains("10000"), "{msg}");
    }
    let t = specs
        .iter()
        .position(|s| s.name == "model.norm.weight")
        .unwrap();
    let d = TempDir::new().unwrap();
    let value = |tt: usize, i: usize| if tt == t && i == 1 { 500.0 } else { val(tt, i) };
    write_model_with(d.path(), &tiny_json(), &specs, Dtype::BF16, 1, &value);
    assert!(load_weights(d.path(), &cfg).is_ok());
}

/// A config that undercounts the file's
/// layers (29 of 30) is refused naming both counts, not loaded short.
#[test]
fn more_layers_in_the_file_than_the_config_is_an_error() {
    let cfg = tiny_cfg();
    let specs = tensor_specs(&cfg, true);
    let d = TempDir::new().unwrap();
    let mut fewer: serde_json::Value = serde_json::from_str(&tiny_json()).unwrap();
    fewer["num_hidden_layers"] = (cfg.num_layers - 1).into();
    let short_cfg = ModelConfig::from_json(&fewer.to_string(), "test").unwrap();
    for shards in [1, 2] {
        write_model(d.path(), &fewer.to_string(), &specs, Dtype::BF16, shards);
        let err = load_weights(d.path(), &short_cfg).unwrap_err();
        assert!(matches!(err, LoadError::ExtraLayers { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("{} layers", cfg.num_layers))
                && msg.contains(&format!("is {}", cfg.num_layers - 1)),
            "{msg}"
        );
    }
}

/// Q/K/V biases (in a config that does not ask for them) are refused
/// naming the tensor and the spec field, not silently ignored; a config
/// that asks for extra tensors gets them, and one missing is named.
#[test]
fn extra_tensors_follow_the_spec() {
    let cfg = tiny_cfg();
    let mut specs = tensor_specs(&cfg, true);
    specs.push(TensorSpec {
        name: "model.layers.0.self_attn.q_proj.bias".into(),
        shape: vec![cfg.q_dim()],
    });
    let d = TempDir::new().unwrap();
    write_model(d.path(), &tiny_json(), &specs, Dtype::BF16, 1);
    let err = load_weights(d.path(), &cfg).unwrap_err().to_string();
    assert!(
        err.contains("model.layers.0.self_attn.q_proj.bias") && err.contains("attention.qkv_bias"),
        "{err}"
    );
    // the tiny model described as Qwen3 with attention biases
    let json = Preset::TinyExtras.config_json().to_string();
    let q3 = ModelConfig::from_json(&json, "config.json").unwrap();
    let all = tensor_specs(&q3, true);
    for (i, name) in [
        "model.layers.1.self_attn.k_norm.weight",
        "model.layers.1.self_attn.o_proj.bias",
    ]
    .into_iter()
    .enumerate()
    {
        assert!(all.iter().any(|t| t.name == name), "{name}");
        let d = TempDir::new().unwrap();
        let fewer: Vec<TensorSpec> = all.iter().filter(|t| t.name != name).cloned().collect();
        write_model(d.path(), &json, &fewer, Dtype::BF16, 1 + i);
        let err = load_weights(d.path(), &q3).unwrap_err().to_string();
        assert!(err.contains(name), "{err}");
    }
    let d = TempDir::new().unwrap();
    write_model(d.path(), &json, &all, Dtype::BF16, 1);
    let w = load_weights(d.path(), &q3).unwrap();
    assert_eq!(w.layers[2].extras.len(), 6);
    assert_eq!(
        w.layers[2].extra(Extra::QNorm).map(|t| t.shape.clone()),
        Some(vec![cfg.head_dim])
    );
}

#[test]
fn wrong_shape_names_file_and_tensor() {
    let d = TempDir::new().unwrap();
    let cfg = tiny_cfg();
    let mut specs = tensor_specs(&cfg, true);
    let bad = specs
        .iter_mut()
        .find(|s| s.name == "model.layers.0.self_attn.v_proj.weight")
        .unwrap();
    bad.shape = vec![cfg.q_dim(), cfg.hidden_size];
    write_model(d.path(), &tiny_json(), &specs, Dtype::BF16, 1);
    let err = load_weights(d.path(), &cfg).unwrap_err();
    assert!(matches!(err, LoadError::Shape { .. }), "{err}");
    let err = err.to_string();
    assert!(
        err.contains("model.layers.0.self_attn.v_proj.weight") && err.contains(SINGLE_FILE),
        "{err}"
    );
    assert!(
        err.contains(&format!("expected [{}, {}]", cfg.kv_dim(), cfg.hidden_size)),
        "{err}"
    );
}

#[test]
fn wrong_dtype_names_file_and_tensor() {
    let d = TempDir::new().unwrap();
    let cfg = tiny_cfg();
    write_model(
        d.path(),
        &tiny_json(),
        &tensor_specs(&cfg, true),
        Dtype::I32,
        1,
    );
    let err = load_weights(d.path(), &cfg).unwrap_err();
    assert!(matches!(err, LoadError::Dtype { .. }), "{err}");
    let err = err.to_string();
    assert!(
        err.contains("I32")
            && err.contains("model.embed_tokens.weight")
            && err.contains(SINGLE_FILE),
        "{err}"
    );
}

#[test]
fn truncated_file_names_file_and_tensor() {
    let d = TempDir::new().unwrap();
    synth_model(Preset::Tiny, 3, d.path()).unwrap();
    let cfg = tiny_cfg();
    let path = d.path().join(SINGLE_FILE);
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 100).unwrap();
    let err = load_weights(d.path(), &cfg).unwrap_err();
    assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
    let last = tensor_specs(&cfg, true).pop().unwrap().name; // data is written in spec order
    let msg = err.to_string();
    assert!(msg.contains(&last) && msg.contains(SINGLE_FILE), "{msg}");
    // cut inside the header: still an error naming the file, no panic
    f.set_len(20).unwrap();
    let msg = load_weights(d.path(), &cfg).unwrap_err().to_string();
    assert!(msg.contains(SINGLE_FILE), "{msg}");
}

#[test]
fn no_weights_is_an_error() {
    let d = TempDir::new().unwrap();
    std::fs::write(d.path().join("config.json"), tiny_json()).unwrap();
    let err = load_weights(d.path(), &tiny_cfg()).unwrap_err().to_string();
    assert!(
        err.contains("no weights") && err.contains(SINGLE_FILE),
        "{err}"
    );
}

#[test]
fn writer_rejects_wrong_element_counts() {
    let d = TempDir::new().unwrap();
    let p = d.path().join("x.safetensors");
    let specs = vec![TensorSpec {
        name: "a".into(),
        shape: vec![2, 3],
    }];
    let mut w = SafetensorsWriter::create(&p, specs.clone()).unwrap();
    assert!(w.write_chunk(&[bf16::ONE; 7]).is_err());
    w.write_chunk(&[bf16::ONE; 4]).unwrap();
    assert!(
        w.finish()
            .unwrap_err()
            .to_string()
            .contains("`a` incomplete")
    );
    let mut w = SafetensorsWriter::create(&p, specs).unwrap();
    w.write_chunk(&[bf16::ONE; 6]).unwrap();
    assert!(w.write_chunk(&[bf16::ONE]).is_err());
    w.finish().unwrap();
    let bytes = std::fs::read(&p).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("a").unwrap().shape(), &[2, 3]);
}
