//! The draft model of speculative decoding ([`crate::Drafting::Draft`]),
//! checked against the target before any weight loads and then opened
//! beside each replica's backend through the same construction code (CPU
//! with CPU, a second CUDA backend on the same device with CUDA), its KV
//! pool as many blocks as the target's so it holds every sequence the
//! target holds. On CUDA its weights, workspace and pool come off the
//! target's share of the device before the target's pool is sized
//! ([`Companion`]).
//!
//! Refused at start, naming the setting: a draft model that cannot be
//! found or read, a vocabulary or tokenizer that differs from the target's
//! (both sizes or ids named), a draft model larger than the target.

use std::borrow::Cow;

use checkpoint::loader::LoadedModel;
use contract::Backend;
use engine::speculate::draft_model::check_draft_config;
use tokenizer::Tokenizer;

use crate::backend::open_backend;
use crate::error::{Context, RuntimeError, invalid};
use crate::kv_sizing::{Companion, GpuMemoryPlan};
use crate::options::{KvOptions, LoraOptions, RuntimeOptions, WeightOptions};
use crate::resolve::{cap_context, display_name, model_dir};
use crate::weights::{cpu_weights, load_weights};

/// A draft model resolved and checked against its target.
pub(crate) struct DraftPlan {
    /// As the options name it.
    name: String,
    loaded: LoadedModel,
}

/// Texts whose ids the two tokenizers must agree on.
const PROBES: [&str; 3] = [
    "The quick brown fox jumps over the lazy dog.",
    "fn main() { println!(\"{}\", 42); }",
    "Zürich, 東京 and São Paulo: 3.14159 ≈ π",
];

/// The draft model the options name (`None` for another method or none),
/// checked against the target `target` / `tok`.
pub(crate) fn plan(
    opts: &RuntimeOptions,
    target: &LoadedModel,
    tok: &Tokenizer,
) -> Result<Option<DraftPlan>, RuntimeError> {
    let Some(name) = opts.speculative.draft_model() else {
        return Ok(None);
    };
    let flag = format!("--speculative draft:{name}");
    let dir = model_dir(name).with_context(|| format!("invalid `{flag}`: the draft model"))?;
    let mut loaded = checkpoint::loader::load_config(&dir)
        .with_context(|| format!("invalid `{flag}`: the draft model's config"))?;
    // the draft never runs past the target's context
    let ctx = target
        .config
        .max_position_embeddings
        .min(loaded.config.max_position_embeddings);
    cap_context(&mut loaded.config, Some(ctx))?;
    if let Err(why) = check_draft_config(&loaded.config, &target.config) {
        invalid!("invalid `{flag}`: {why}");
    }
    let draft_tok = Tokenizer::from_dir(&dir)
        .with_context(|| format!("invalid `{flag}`: the draft model's tokenizer"))?;
    if let Err(why) = check_tokenizers(&draft_tok, tok) {
        invalid!("invalid `{flag}`: {why}");
    }
    Ok(Some(DraftPlan {
        name: display_name(name),
        loaded,
    }))
}

/// The draft's and the target's tokenizers give the same ids: vocabulary
/// size, EOS and BOS ids, and the ids of a few probe texts.
fn check_tokenizers(draft: &Tokenizer, target: &Tokenizer) -> Result<(), String> {
    let (dv, tv) = (draft.vocab_size(), target.vocab_size());
    if dv != tv {
        return Err(format!(
            "the draft model's tokenizer has {dv} tokens, the target's {tv}; the draft model must share the target's tokenizer"
        ));
    }
    let (de, te) = (draft.eos_ids(), target.eos_ids());
    if de != te || draft.bos_id() != target.bos_id() {
        return Err(format!(
            "the draft model's tokenizer has BOS {:?} / EOS {de:?}, the target's BOS {:?} / EOS {te:?}",
            draft.bos_id(),
            target.bos_id()
        ));
    }
    for text in PROBES {
        let (d, t) = (draft.encode(text, false), target.encode(text, false));
        match (d, t) {
            (Ok(d), Ok(t)) if d == t => {}
            (d, t) => {
                return Err(format!(
                    "the tokenizers disagree on {text:?}: draft {d:?}, target {t:?}"
                ));
            }
        }
    }
    Ok(())
}

impl DraftPlan {
    /// The name the options gave.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its device bytes beside the target's ([`Companion`]).
    pub(crate) fn companion(&self, opts: &RuntimeOptions) -> Companion {
        Companion::of(opts, &self.loaded.config)
    }

    /// Opens the draft model on `device` (`None`: the CPU) as the target
    /// of `opts` is opened, its KV pool `blocks` blocks.
    pub(crate) fn open(
        &self,
        opts: &RuntimeOptions,
        device: Option<usize>,
        blocks: usize,
        gpu_memory: &GpuMemoryPlan,
    ) -> Result<Box<dyn Backend>, RuntimeError> {
        let flag = format!("--speculative draft:{}", self.name);
        let cuda = device.is_some();
        let opts = RuntimeOptions {
            kv: KvOptions {
                blocks: Some(blocks),
                memory_gib: None,
                ..opts.kv
            },
            // FP8 activations are the target's: the draft may have BF16
            // weights; its head stays as loaded
            weights: WeightOptions {
                quantize_lm_head: false,
                fp8_activations: false,
                ..opts.weights
            },
            // the draft runs without adapters: no LoRA slots for it
            lora: LoraOptions {
                adapters: Vec::new(),
                max_loras: Some(0),
                ..opts.lora.clone()
            },
            ..opts.clone()
        };
        let (format, path) = (opts.weights.format, opts.cpu.path);
        let cpu = cpu_weights(format, path, cuda)
            .with_context(|| format!("`{flag}`: the draft model's weights"))?;
        let (weights, _) = load_weights(&opts.weights, path, &self.loaded, cuda)
            .with_context(|| format!("`{flag}`: the draft model's weights"))?;
        let opened = open_backend(
            &opts,
            &self.loaded,
            device,
            Cow::Owned(weights),
            &cpu,
            gpu_memory,
            None,
        )
        .with_context(|| format!("`{flag}`: starting the draft model"))?;
        Ok(opened.backend)
    }
}
