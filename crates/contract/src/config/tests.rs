//! Parsing and validation of `config.json` / `generation_config.json`, and
//! the RoPE frequencies of Llama 3.2 1B.

use super::*;

const LLAMA_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
  "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
  "vocab_size": 128256, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
  "max_position_embeddings": 131072, "rope_theta": 500000.0,
  "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}"#;

#[test]
fn parses_llama_3_2_1b() {
    let c = ModelConfig::from_json(LLAMA_1B, "config.json").unwrap();
    assert_eq!(
        (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim),
        (2048, 32, 8, 64)
    );
    assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
    assert!(matches!(c.rope().scaling, RopeScaling::Llama3 { .. }));
    let inv = c.rope_inv_freq();
    assert_eq!(inv.len(), 32);
    // the highest frequency is untouched, the lowest divided by the factor
    assert!((inv[0] - 1.0).abs() < 1e-12);
    let plain = 1.0 / 500000f64.powf(62.0 / 64.0);
    assert!((inv[31] - plain / 32.0).abs() < 1e-15);
}

#[test]
fn reads_rope_parameters_object() {
    let text = LLAMA_1B.replace("\"rope_theta\": 500000.0,", "").replace(
        "\"rope_scaling\": {\"rope_type\"",
        "\"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\"",
    );
    let c = ModelConfig::from_json(&text, "config.json").unwrap();
    let d = ModelConfig::from_json(LLAMA_1B, "config.json").unwrap();
    assert_eq!(c, d);
}

#[test]
fn head_dim_derived() {
    let text = LLAMA_1B.replace("\"head_dim\": 64,", "");
    assert_eq!(ModelConfig::from_json(&text, "c").unwrap().head_dim, 64);
}

#[test]
fn rejects_inconsistent_configs_naming_the_field() {
    let cases = [
        (
            LLAMA_1B.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 7"),
            "num_key_value_heads",
        ),
        (
            LLAMA_1B
                .replace("\"head_dim\": 64,", "")
                .replace("\"hidden_size\": 2048", "\"hidden_size\": 2050"),
            "hidden_size",
        ),
        (LLAMA_1B.replace("\"llama3\"", "\"yarn\""), "rope_type"),
        (
            LLAMA_1B.replace("\"vocab_size\": 128256,", ""),
            "vocab_size",
        ),
        (
            LLAMA_1B.replace("\"num_hidden_layers\": 16", "\"num_hidden_layers\": 0"),
            "num_hidden_layers",
        ),
        (
            LLAMA_1B.replace("\"num_hidden_layers\": 16", "\"num_hidden_layers\": 4097"),
            "num_hidden_layers",
        ),
        // a rotary base below 1 (1e-300 once generated garbage)
        (
            LLAMA_1B.replace("\"rope_theta\": 500000.0", "\"rope_theta\": 1e-300"),
            "rope_theta",
        ),
    ];
    for (text, field) in cases {
        let err = ModelConfig::from_json(&text, "m/config.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{err} should name {field}");
        assert!(err.contains("m/config.json"), "{err}");
    }
    let err = ModelConfig::from_json("{not json", "m/config.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("malformed m/config.json"), "{err}");
}

/// A special token id the embedding has no row for (an EOS that could
/// never be sampled) is refused naming the field and the id.
#[test]
fn special_token_ids_outside_the_vocabulary_are_refused() {
    for id in ["128256", "128257", "1000000000", "4294967295"] {
        for (from, to, field) in [
            (
                "\"bos_token_id\": 128000",
                format!("\"bos_token_id\": {id}"),
                "bos_token_id",
            ),
            ("128008, 128009]", format!("128008, {id}]"), "eos_token_id"),
        ] {
            let text = LLAMA_1B.replace(from, &to);
            let err = ModelConfig::from_json(&text, "m/config.json")
                .unwrap_err()
                .to_string();
            assert!(err.contains(field) && err.contains(id), "{err}");
        }
    }
    let last = LLAMA_1B.replace("128008, 128009]", "128008, 128255]");
    assert!(ModelConfig::from_json(&last, "m/config.json").is_ok());
}

/// Each family is a spec: Qwen2 adds Q/K/V biases, Qwen3 QK-norm (and
/// its `attention_bias` biases on Q/K/V/O), Llama's `attention_bias` and
/// `mlp_bias` their biases; an unknown architecture or activation is
/// refused naming the field; Mistral v0.1 (a sliding window shorter than
/// the context) is refused, and Mistral without a window is Llama.
#[test]
fn llama_family_variants() {
    let spec = |text: &str| ModelConfig::from_json(text, "q/config.json").map(|c| c.spec);
    let llama = spec(LLAMA_1B).unwrap();
    let qwen2 = spec(&LLAMA_1B.replace("LlamaForCausalLM", "Qwen2ForCausalLM")).unwrap();
    let a = &qwen2.layers[0].attention;
    assert!(a.qkv_bias && !a.o_bias && !a.qk_norm);
    let qwen3 = LLAMA_1B.replace("LlamaForCausalLM", "Qwen3ForCausalLM");
    let a = &spec(&qwen3).unwrap().layers[3].attention;
    assert!(a.qk_norm && !a.qkv_bias && !a.o_bias);
    let biased = qwen3.replace(
        "\"head_dim\": 64,",
        "\"head_dim\": 64, \"attention_bias\": true,",
    );
    let a = &spec(&biased).unwrap().layers[3].attention;
    assert!(a.qk_norm && a.qkv_bias && a.o_bias);
    let mlp = LLAMA_1B.replace("\"head_dim\": 64,", "\"head_dim\": 64, \"mlp_bias\": true,");
    let m = spec(&mlp).unwrap();
    assert_eq!(
        m.first_difference(&llama).as_deref(),
        Some("layers[0].mlp.bias")
    );
    for (text, field) in [
        (
            LLAMA_1B.replace("LlamaForCausalLM", "GPTNeoXForCausalLM"),
            "architectures",
        ),
        (
            LLAMA_1B.replace(
                "\"head_dim\": 64,",
                "\"head_dim\": 64, \"hidden_act\": \"relu\",",
            ),
            "hidden_act",
        ),
    ] {
        let err = spec(&text).unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    let mistral = LLAMA_1B.replace("LlamaForCausalLM", "MistralForCausalLM");
    let windowed = mistral.replace(
        "\"head_dim\": 64,",
        "\"head_dim\": 64, \"sliding_window\": 4096,",
    );
    let err = ModelConfig::from_json(&windowed, "m/config.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sliding_window") && err.contains("4096") && err.contains("not supported"),
        "{err}"
    );
    let llama = ModelConfig::from_json(LLAMA_1B, "config.json").unwrap();
    for ok in [
        mistral.clone(),
        mistral.replace(
            "\"head_dim\": 64,",
            "\"head_dim\": 64, \"sliding_window\": null,",
        ),
        windowed.replace(
            "\"head_dim\": 64,",
            "\"head_dim\": 64, \"use_sliding_window\": false,",
        ),
        mistral.replace(
            "\"head_dim\": 64,",
            "\"head_dim\": 64, \"sliding_window\": 131072,",
        ),
    ] {
        assert_eq!(
            ModelConfig::from_json(&ok, "m/config.json").unwrap(),
            llama,
            "{ok}"
        );
    }
    let other = LLAMA_1B.replace("LlamaForCausalLM", "GPT2LMHeadModel");
    let err = ModelConfig::from_json(&other, "g/config.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("GPT2LMHeadModel") && err.contains("MistralForCausalLM"),
        "{err}"
    );
}

#[test]
fn generation_config_extends_eos() {
    let g: GenerationConfig =
        serde_json::from_str(r#"{"eos_token_id": [128001, 128008, 128009]}"#).unwrap();
    assert_eq!(g.eos_ids(&[128009]), vec![128009, 128001, 128008]);
}

/// Sampling defaults a request would fall back on are checked when the file
/// is read, naming the file and the field (not a flag the user never gave).
#[test]
fn generation_config_defaults_must_be_usable() {
    let dir = std::env::temp_dir().join(format!("lamina-gencfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (text, field) in [
        (r#"{"temperature": -5}"#, "temperature"),
        (r#"{"top_p": 0}"#, "top_p"),
        (r#"{"top_p": 1.5}"#, "top_p"),
        (r#"{"min_p": 2}"#, "min_p"),
        (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
        (r#"{"repetition_penalty": -1.1}"#, "repetition_penalty"),
    ] {
        std::fs::write(dir.join("generation_config.json"), text).unwrap();
        let err = GenerationConfig::from_dir(&dir).unwrap_err().to_string();
        assert!(
            err.contains(field) && err.contains("generation_config.json"),
            "{err}"
        );
    }
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"temperature": 0.6, "top_p": 0.9}"#,
    )
    .unwrap();
    assert_eq!(GenerationConfig::from_dir(&dir).unwrap().top_p, Some(0.9));
    std::fs::remove_dir_all(&dir).ok();
}

/// A model that ships no sampling values gets llama.cpp's defaults; one that
/// ships some gets those, with neutral values for the rest.
#[test]
fn sampling_defaults_fall_back_to_llama_cpp_only_when_the_model_ships_none() {
    let none: GenerationConfig = serde_json::from_str(r#"{"eos_token_id": 2}"#).unwrap();
    let d = none.sampling_defaults();
    assert_eq!(d, crate::SamplingDefaults::LLAMA_CPP);
    assert_eq!(
        (d.temperature, d.top_k, d.top_p, d.min_p),
        (0.8, 40, 0.95, 0.05)
    );
    assert!(d.to_string().contains("llama.cpp"), "{d}");
    let some: GenerationConfig =
        serde_json::from_str(r#"{"temperature": 0.2, "top_p": 0.9}"#).unwrap();
    let d = some.sampling_defaults();
    assert_eq!(
        (d.temperature, d.top_k, d.top_p, d.min_p),
        (0.2, 0, 0.9, 0.0)
    );
    assert_eq!(d.source, crate::DefaultsSource::Model);
    assert!(d.to_string().contains("generation_config.json"), "{d}");
}

/// A model's `repetition_penalty` is the default of requests that set none,
/// beside its sampling values or llama.cpp's; without one it stays off.
#[test]
fn the_models_repetition_penalty_is_a_default() {
    let g: GenerationConfig =
        serde_json::from_str(r#"{"temperature": 0.6, "repetition_penalty": 1.1}"#).unwrap();
    let d = g.sampling_defaults();
    assert_eq!(d.repetition_penalty, 1.1);
    assert_eq!(d.params().repetition_penalty, 1.1);
    assert!(d.to_string().contains("repetition penalty 1.1"), "{d}");
    let only: GenerationConfig = serde_json::from_str(r#"{"repetition_penalty": 1.2}"#).unwrap();
    let d = only.sampling_defaults();
    assert_eq!((d.temperature, d.repetition_penalty), (0.8, 1.2));
    let none: GenerationConfig = serde_json::from_str(r#"{"temperature": 0.2}"#).unwrap();
    assert_eq!(none.sampling_defaults().params().repetition_penalty, 1.0);
    assert!(!none.sampling_defaults().to_string().contains("repetition"));
}

/// Gemma 3 270M's config.json as transformers reads it: `(1+w)` norms,
/// four a layer, QK-norm, GeGLU, the embedding scaled by sqrt(640),
/// scores by 256^-1/2, every sixth layer global (RoPE 1e6, no window), the
/// others local (window 512, RoPE 1e4); tied by default.
#[test]
fn gemma3_layers_and_windows() {
    let c = crate::presets::Preset::Gemma3_270m.config().unwrap();
    let s = &c.spec;
    assert_eq!((c.num_layers, c.head_dim, c.num_kv_heads), (18, 256, 1));
    assert!(c.tie_word_embeddings);
    assert_eq!(s.norm_weight_offset, 1.0);
    assert_eq!(s.embed_scale, 640f64.sqrt() as f32);
    assert_eq!(s.final_logit_softcap, None);
    for (i, l) in s.layers.iter().enumerate() {
        let global = (i + 1) % 6 == 0;
        let a = &l.attention;
        assert!(a.qk_norm && !a.qkv_bias && !a.o_bias);
        assert_eq!(a.scale, 1.0 / 16.0);
        assert_eq!(a.window, (!global).then_some(512), "layer {i}");
        assert_eq!(l.rope.theta, if global { 1e6 } else { 1e4 }, "layer {i}");
        assert!(l.post_attention_norm && l.post_mlp_norm);
        assert_eq!(l.mlp.activation, crate::spec::Activation::GeluTanh);
    }
    // the older `sliding_window_pattern` gives the same layers (1B's file)
    let one_b = crate::presets::Preset::Gemma3_1b.config().unwrap();
    assert_eq!(one_b.spec.layers[5].attention.window, None);
    assert_eq!(one_b.spec.layers[6].attention.window, Some(512));
    assert_eq!(one_b.spec.layers[6].rope.theta, 1e4);
}

/// Gemma 3's per-layer-type `rope_parameters` (transformers 5's spelling)
/// and `rope_scaling` on the global layers only; the fields lamina cannot
/// honour are refused by name.
#[test]
fn gemma3_rope_parameters_and_refusals() {
    let base = crate::presets::Preset::Gemma3_270m.config_json();
    let parse = |v: &serde_json::Value| ModelConfig::from_json(&v.to_string(), "g/config.json");
    let mut v = base.clone();
    for k in ["rope_theta", "rope_local_base_freq", "rope_scaling"] {
        v.as_object_mut().unwrap().remove(k);
    }
    v["rope_parameters"] = serde_json::json!({
        "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}});
    let c = parse(&v).unwrap();
    assert_eq!(c.spec.layers[5].rope.theta, 5e5);
    assert_eq!(c.spec.layers[0].rope.theta, 2e4);
    let mut v = base.clone();
    v["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let c = parse(&v).unwrap();
    assert!(matches!(
        c.spec.layers[5].rope.scaling,
        RopeScaling::Llama3 { .. }
    ));
    assert_eq!(c.spec.layers[0].rope.scaling, RopeScaling::None);
    let mut v = base.clone();
    v["final_logit_softcapping"] = serde_json::json!(30.0);
    assert_eq!(parse(&v).unwrap().spec.final_logit_softcap, Some(30.0));
    for (field, value) in [
        ("attn_logit_softcapping", serde_json::json!(50.0)),
        ("use_bidirectional_attention", serde_json::json!(true)),
        ("sliding_window", serde_json::json!(0)),
        ("layer_types", serde_json::json!(["sliding_attention"])),
        ("hidden_activation", serde_json::json!("relu")),
    ] {
        let mut v = base.clone();
        v[field] = value;
        let err = parse(&v).unwrap_err().to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    let mut v = base.clone();
    v["layer_types"][3] = serde_json::json!("chunked_attention");
    let err = parse(&v).unwrap_err().to_string();
    assert!(
        err.contains("layer_types") && err.contains("chunked_attention"),
        "{err}"
    );
    let mut v = base;
    v["architectures"] = serde_json::json!(["Gemma3ForConditionalGeneration"]);
    let err = parse(&v).unwrap_err().to_string();
    assert!(
        err.contains("architectures") && err.contains("language_model"),
        "{err}"
    );
}
