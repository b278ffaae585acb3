//! Whether a GGUF's vocabulary puts BOS in front of a text, decided as
//! llama.cpp's vocabulary loader decides it (`llama_vocab::impl::load`).
//!
//! Contract: [`adds_bos`] is the one place lamina decides it for a GGUF; the
//! importer writes it as `add_bos_token` and `lamina perplexity` reads it
//! again from the GGUF a model came from, so both agree with llama.cpp:
//! 1. `tokenizer.ggml.add_bos_token`, when present, wins (a boolean; any
//!    other type is an error naming the key, as llama.cpp refuses it);
//! 2. else the default of the tokenizer model (`tokenizer.ggml.model`):
//!    `llama` (SentencePiece) and `bert` (WordPiece) add BOS; `t5`, `rwkv`,
//!    `plamo2`, `test`, `no_vocab`/`none` do not; `gpt2` (byte-level BPE),
//!    `hybriddna` and `whitespace` decide by the pre-tokenizer
//!    (`tokenizer.ggml.pre`): the Llama 3 family (`llama3`, `llama-v3`,
//!    `llama-bpe`, `falcon3`, `falcon-h1`, `pixtral`, `midm-2.0`, `lfm2`,
//!    `jina-v5-nano`), `tekken` and `chameleon` add BOS, every other one
//!    (and a missing key, llama.cpp's `default`) does not; any other model
//!    is an error naming it, as llama.cpp refuses it;
//! 3. a Gemma 4 vocabulary (model `gemma4`, or pre-tokenizer `gemma4` /
//!    `granite-embed-multi-311m`) adds BOS whatever the key says, as
//!    llama.cpp forces it.
//!
//! A pre-tokenizer llama.cpp does not know is left to the tokenizer import
//! (`tokenizer::bpe_from_gguf`), which refuses any it cannot reproduce.

use std::path::Path;

use super::{Gguf, GgufError};

const MODEL_KEY: &str = "tokenizer.ggml.model";
const PRE_KEY: &str = "tokenizer.ggml.pre";
const ADD_BOS_KEY: &str = "tokenizer.ggml.add_bos_token";

/// BPE pre-tokenizers whose vocabularies add BOS by default.
const BPE_PRE_WITH_BOS: &[&str] = &[
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "tekken",
    "chameleon",
];

/// Pre-tokenizers of Gemma 4, which always adds BOS.
const GEMMA4_PRE: &[&str] = &["gemma4", "granite-embed-multi-311m"];

/// llama.cpp's default for a vocabulary of tokenizer `model` with
/// pre-tokenizer `pre` (`None`: the key is absent), when the GGUF does not
/// say; `Err` names an unknown model.
fn default_adds_bos(model: &str, pre: Option<&str>) -> Result<bool, String> {
    match model {
        "llama" | "bert" | "gemma4" => Ok(true),
        "gpt2" | "hybriddna" | "whitespace" => {
            Ok(pre.is_some_and(|p| BPE_PRE_WITH_BOS.contains(&p) || GEMMA4_PRE.contains(&p)))
        }
        "t5" | "rwkv" | "plamo2" | "test" | "no_vocab" | "none" => Ok(false),
        other => Err(format!("unknown tokenizer model `{other}`")),
    }
}

/// Whether the vocabulary of `g` adds BOS; see the module doc.
pub fn adds_bos(g: &Gguf) -> Result<bool, GgufError> {
    let model = g.get_str(MODEL_KEY)?;
    let pre = match g.metadata.get(PRE_KEY) {
        Some(_) => Some(g.get_str(PRE_KEY)?),
        None => None,
    };
    let gemma4 = model == "gemma4" || pre.is_some_and(|p| GEMMA4_PRE.contains(&p));
    if let Some(v) = g.metadata.get(ADD_BOS_KEY) {
        let explicit = v.as_bool().ok_or_else(|| GgufError::Metadata {
            key: ADD_BOS_KEY.into(),
            reason: format!("expected a boolean, got {v:?}"),
        })?;
        return Ok(explicit || gemma4);
    }
    default_adds_bos(model, pre).map_err(|reason| GgufError::Metadata {
        key: MODEL_KEY.into(),
        reason,
    })
}

/// [`adds_bos`] of the GGUF file at `path` (its header only is read).
pub fn file_adds_bos(path: &Path) -> Result<bool, GgufError> {
    let io = |source| GgufError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: read-only private map, parsed once here through bounds-checked
    // slices; a file changed underneath gives a parse error or a wrong
    // answer, never UB in safe code.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    let g = Gguf::parse(&map, &path.display().to_string())?;
    adds_bos(&g)
}

#[cfg(test)]
mod tests {
    use super::super::Value;
    use super::*;

    fn gguf(kv: &[(&str, Value)]) -> Gguf {
        Gguf {
            path: "t.gguf".into(),
            version: 3,
            metadata: kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            tensors: Vec::new(),
            alignment: 32,
            data_start: 0,
        }
    }

    fn s(x: &str) -> Value {
        Value::String(x.into())
    }

    /// `adds_bos` of a GGUF with tokenizer `model`, pre-tokenizer `pre` and
    /// `add_bos_token` as given.
    fn decide(model: &str, pre: Option<&str>, key: Option<bool>) -> Result<bool, GgufError> {
        let mut kv = vec![(MODEL_KEY, s(model))];
        if let Some(p) = pre {
            kv.push((PRE_KEY, s(p)));
        }
        if let Some(b) = key {
            kv.push((ADD_BOS_KEY, Value::Bool(b)));
        }
        adds_bos(&gguf(&kv))
    }

    #[test]
    fn sentencepiece_and_wordpiece_add_bos_by_default() {
        assert!(decide("llama", None, None).unwrap());
        assert!(decide("bert", None, None).unwrap());
    }

    #[test]
    fn t5_rwkv_and_the_rest_do_not() {
        for model in ["t5", "rwkv", "plamo2", "test", "no_vocab", "none"] {
            assert!(!decide(model, None, None).unwrap(), "{model}");
        }
    }

    #[test]
    fn byte_level_bpe_decides_by_its_pre_tokenizer() {
        for pre in BPE_PRE_WITH_BOS {
            assert!(decide("gpt2", Some(pre), None).unwrap(), "{pre}");
        }
        for pre in ["smollm", "qwen2", "gpt-2", "deepseek-v3", "default"] {
            assert!(!decide("gpt2", Some(pre), None).unwrap(), "{pre}");
        }
        // no pre-tokenizer key: llama.cpp's `default`
        assert!(!decide("gpt2", None, None).unwrap());
        assert!(decide("whitespace", Some("llama-bpe"), None).unwrap());
    }

    #[test]
    fn the_explicit_key_wins() {
        assert!(!decide("llama", None, Some(false)).unwrap());
        assert!(!decide("gpt2", Some("llama-bpe"), Some(false)).unwrap());
        assert!(decide("gpt2", Some("smollm"), Some(true)).unwrap());
        assert!(decide("t5", None, Some(true)).unwrap());
    }

    #[test]
    fn gemma4_always_adds_bos() {
        assert!(decide("gemma4", None, None).unwrap());
        assert!(decide("gemma4", None, Some(false)).unwrap());
        assert!(decide("gpt2", Some("gemma4"), Some(false)).unwrap());
        assert!(decide("gpt2", Some("granite-embed-multi-311m"), None).unwrap());
    }

    #[test]
    fn unknown_models_and_mistyped_keys_are_errors_naming_them() {
        let e = decide("sentencepiece", None, None).unwrap_err().to_string();
        assert!(
            e.contains(MODEL_KEY) && e.contains("`sentencepiece`"),
            "{e}"
        );
        let mut kv = vec![(MODEL_KEY, s("gpt2")), (ADD_BOS_KEY, Value::U8(1))];
        let e = adds_bos(&gguf(&kv)).unwrap_err().to_string();
        assert!(e.contains(ADD_BOS_KEY) && e.contains("boolean"), "{e}");
        kv[1] = (PRE_KEY, Value::U32(3));
        let e = adds_bos(&gguf(&kv)).unwrap_err().to_string();
        assert!(e.contains(PRE_KEY), "{e}");
        let e = adds_bos(&gguf(&[])).unwrap_err().to_string();
        assert!(e.contains(MODEL_KEY) && e.contains("missing"), "{e}");
    }
}
