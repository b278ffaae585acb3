//! Synthetic model tests: determinism, loadability, weight statistics, the
//! byte-level tokenizer, and the presets' configs.

use super::*;
use crate::loader::{load_config, load_weights};
use contract::config::RopeScaling;
use tempfile::TempDir;

fn read_all(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn same_seed_same_bytes_other_seed_other_weights() {
    let (a, b, c) = (
        TempDir::new().unwrap(),
        TempDir::new().unwrap(),
        TempDir::new().unwrap(),
    );
    synth_model(Preset::Tiny, 42, a.path()).unwrap();
    synth_model(Preset::Tiny, 42, b.path()).unwrap();
    synth_model(Preset::Tiny, 43, c.path()).unwrap();
    let (fa, fb, fc) = (read_all(a.path()), read_all(b.path()), read_all(c.path()));
    let names: Vec<_> = fa.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    assert!(fa == fb, "same seed must give identical files");
    let weights = |f: &[(String, Vec<u8>)]| f[2].1.clone();
    assert_ne!(weights(&fa), weights(&fc));
    assert_eq!(fa[0], fc[0]);
}

#[test]
fn generator_is_pinned() {
    // the exact stream is part of the contract (golden files depend on it)
    assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    let key = tensor_key(1, "model.norm.weight");
    let z: Vec<f32> = (0..4).map(|i| normalish(key, i)).collect();
    let again: Vec<f32> = (0..4)
        .map(|i| normalish(tensor_key(1, "model.norm.weight"), i))
        .collect();
    assert_eq!(z, again);
    assert_ne!(
        normalish(key, 0),
        normalish(tensor_key(2, "model.norm.weight"), 0)
    );
}

#[test]
fn tiny_loads_with_plausible_statistics() {
    let d = TempDir::new().unwrap();
    synth_model(Preset::Tiny, 1, d.path()).unwrap();
    let m = load_config(d.path()).unwrap();
    assert_eq!(m.config, Preset::Tiny.config().unwrap());
    assert_eq!(m.eos_ids, vec![257]);
    assert!(!m.config.tie_word_embeddings);
    assert!(
        m.config.num_heads > m.config.num_kv_heads,
        "tiny must exercise GQA"
    );
    assert!(matches!(
        m.config.rope().scaling,
        RopeScaling::Llama3 { .. }
    ));
    let w = load_weights(d.path(), &m.config).unwrap();
    assert!(w.lm_head.is_some());
    let stats = |x: &[f32]| {
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var.sqrt())
    };
    let (mean, sd) = stats(&w.embed.to_f32());
    assert!(
        mean.abs() < 0.002 && (sd - 0.02).abs() < 0.002,
        "embed mean {mean} sd {sd}"
    );
    let norm = w.layers[0].input_norm.to_f32();
    let (mean, sd) = stats(&norm);
    assert!(
        (mean - 1.0).abs() < 0.02 && sd > 0.02 && sd < 0.08,
        "norm mean {mean} sd {sd}"
    );
    assert!(norm.iter().all(|&v| v > 0.7 && v < 1.3));
    assert_ne!(w.layers[0].q_proj, w.layers[1].q_proj);
}

#[test]
fn byte_tokenizer_round_trips_and_every_id_decodes() {
    let d = TempDir::new().unwrap();
    synth_model(Preset::Tiny, 1, d.path()).unwrap();
    let cfg = Preset::Tiny.config().unwrap();
    let tok = tokenizers::Tokenizer::from_file(d.path().join("tokenizer.json")).unwrap();
    assert_eq!(tok.get_vocab_size(true), cfg.vocab_size);
    let text = "Héllo, wörld! 123 \u{1F600}";
    let enc = tok.encode(text, true).unwrap();
    let ids = enc.get_ids();
    assert_eq!(ids[0], cfg.bos_token_id.unwrap());
    assert_eq!(ids.len(), 1 + text.len(), "one token per UTF-8 byte");
    assert_eq!(tok.decode(&ids[1..], false).unwrap(), text);
    assert_eq!(tok.decode(ids, true).unwrap(), text);
    for id in 0..cfg.vocab_size as u32 {
        assert!(tok.id_to_token(id).is_some(), "id {id} has no token");
        tok.decode(&[id], false).unwrap();
    }
    assert_eq!(
        tok.id_to_token(257).as_deref(),
        Some(tokenizer::byte_level::EOS)
    );
    let tc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(tc["eos_token"], tokenizer::byte_level::EOS);
    assert_eq!(tc["add_bos_token"], true);
}

#[test]
fn byte_tokenizer_places_specials_where_the_config_says() {
    // SmolLM2's layout: BOS 1, EOS 2, so bytes start at 0 and skip them
    let json = tokenizer::byte_level::tokenizer_json(300, 1, 2);
    let tok: tokenizers::Tokenizer = json.parse().unwrap();
    assert_eq!(
        tok.id_to_token(1).as_deref(),
        Some(tokenizer::byte_level::BOS)
    );
    assert_eq!(
        tok.id_to_token(2).as_deref(),
        Some(tokenizer::byte_level::EOS)
    );
    assert_eq!(tok.id_to_token(0).as_deref(), Some("Ā")); // byte 0
    assert_eq!(tok.encode("A", false).unwrap().get_ids(), &[65 + 2]);
    assert_eq!(tok.id_to_token(299).as_deref(), Some("<|filler_41|>"));
}

#[test]
fn preset_configs_match_the_real_models() {
    let l = Preset::Llama3_2_1b.config().unwrap();
    assert_eq!(
        (
            l.hidden_size,
            l.intermediate_size,
            l.num_layers,
            l.num_heads,
            l.num_kv_heads,
            l.head_dim
        ),
        (2048, 8192, 16, 32, 8, 64)
    );
    assert_eq!((l.vocab_size, l.max_position_embeddings), (128256, 131072));
    assert_eq!(l.bos_token_id, Some(128000));
    assert_eq!(l.eos_token_ids, vec![128001, 128008, 128009]);
    assert!(l.tie_word_embeddings);
    assert_eq!(l.rope().theta, 500000.0);
    assert_eq!(
        l.rope().scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert_eq!(Preset::Llama3_2_1b.config_json()["torch_dtype"], "bfloat16");
    let s = Preset::Smollm2_135m.config().unwrap();
    assert_eq!(
        (
            s.hidden_size,
            s.intermediate_size,
            s.num_layers,
            s.num_heads,
            s.num_kv_heads,
            s.vocab_size
        ),
        (576, 1536, 30, 9, 3, 49152)
    );
    assert_eq!(
        (s.rope().theta, s.max_position_embeddings, s.rms_norm_eps),
        (100000.0, 8192, 1e-5)
    );
    assert!(s.tie_word_embeddings && s.rope().scaling == RopeScaling::None);
    assert_eq!(
        "smollm2-135m".parse::<Preset>().unwrap(),
        Preset::Smollm2_135m
    );
    let err = "gpt-5".parse::<Preset>().unwrap_err();
    assert!(err.contains("tiny, smollm2-135m, llama-3.2-1b"), "{err}");
}

#[test]
fn qwen_presets_match_the_real_models() {
    let dims = |p: Preset| {
        let c = p.config().unwrap();
        let a = &c.spec.layers[0].attention;
        (
            (c.hidden_size, c.intermediate_size, c.num_layers),
            (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size),
            (a.qkv_bias, a.o_bias, a.qk_norm, c.tie_word_embeddings),
        )
    };
    assert_eq!(
        dims(Preset::Qwen3_0_6b),
        (
            (1024, 3072, 28),
            (16, 8, 128, 151936),
            (false, false, true, true)
        )
    );
    assert_eq!(
        dims(Preset::Qwen3_1_7b),
        (
            (2048, 6144, 28),
            (16, 8, 128, 151936),
            (false, false, true, true)
        )
    );
    assert_eq!(
        dims(Preset::Qwen2_5_0_5b),
        (
            (896, 4864, 24),
            (14, 2, 64, 151936),
            (true, false, false, true)
        )
    );
    let q = Preset::Qwen3_0_6b.config().unwrap();
    assert_eq!((q.rope().theta, q.rms_norm_eps), (1e6, 1e-6));
    assert_eq!(q.max_position_embeddings, 40960);
    assert_eq!(q.eos_token_ids, vec![151645]);
    let g = Preset::Qwen3_0_6b.generation_config_json();
    assert_eq!(g["eos_token_id"], serde_json::json!([151645, 151643]));
    assert_eq!("qwen2.5-0.5b".parse::<Preset>(), Ok(Preset::Qwen2_5_0_5b));
    // `layers` cuts the config written (and the weights with it)
    let opts = SynthOptions {
        preset: Preset::Qwen2_5_0_5b,
        seed: 0,
        tokenizer_wheel: None,
        tokenizer_npm: None,
        layers: Some(2),
    };
    assert_eq!(opts.config_json()["num_hidden_layers"], 2);
}

#[test]
fn a_layer_cut_cuts_the_per_layer_types_too() {
    let opts = SynthOptions {
        preset: Preset::Gemma3_270m,
        seed: 0,
        tokenizer_wheel: None,
        tokenizer_npm: None,
        layers: Some(6),
    };
    let c = opts.config_json();
    let types = c["layer_types"].as_array().unwrap();
    assert_eq!(types.len(), 6);
    assert_eq!(types[5], "full_attention");
    let cfg = ModelConfig::from_json(&c.to_string(), "cut").unwrap();
    let windows: Vec<_> = cfg.spec.layers.iter().map(|l| l.attention.window).collect();
    assert_eq!(
        windows,
        [Some(512), Some(512), Some(512), Some(512), Some(512), None]
    );
}
