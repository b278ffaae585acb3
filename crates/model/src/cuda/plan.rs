//! The step plan: the one place that decides which kernels a step runs.
//!
//! Contract: [`StepPlan::new`] turns a step's shape ([`StepShape`]: tokens,
//! sequences, sampled rows, attention kind) and the backend's fixed
//! [`Tuning`] into every kernel choice of the step: fused GEMVs or cuBLAS
//! GEMMs for the projections, the attention path, whether the last layer
//! runs on the sampled rows alone, how the LM head reads its rows and which
//! product it runs on. `forward` executes a plan and decides nothing; the
//! same plan is what a captured decode graph replays, so a plan depends on
//! the staged shape alone, never on device data.
//!
//! The rules (H200, Llama-3.2-1B; `docs/performance.md` has the figures):
//! - projections: steps of at most `gemv_rows` tokens run the fused GEMVs
//!   (norm, RoPE + KV write, SiLU and residual adds inside), larger ones
//!   cuBLAS plus the unfused kernels;
//! - attention: pure-decode steps run the split-KV decode kernel, or the
//!   narrow flash tiling from `narrow_decode_seqs` sequences on; other steps
//!   the flash prefill kernel where it serves the head shape (a mixed step
//!   with many one-token segments splits them onto the narrow tiling), else
//!   the scalar prefill kernel;
//! - last layer: a GEMM step sampling fewer rows than it has tokens runs
//!   the last layer's O projection, MLP and the final norm on those rows
//!   (not with LoRA rows: their slots are staged per token);
//! - LM head: a GEMV for at most [`HEAD_GEMV_ROWS`] rows, else cuBLAS,
//!   reading the normed rows in place when they are already the sampled
//!   ones in order;
//! - LoRA (a step with adapter rows): the deltas of each targeted
//!   projection, in the GEMV epilogues on the GEMV path;
//! - persistent decode (when enabled): a one-token decode step on the GEMV
//!   path and the decode kernel, without adapter rows, may run its layers
//!   as one persistent launch (`kernels::persistent`);
//! - deterministic mode: the GEMMs (on pinned, batch-invariant algorithms,
//!   `invariant`) at every row count, the LM head too, and attention on
//!   one fixed flash tiling for every row, prompt or decode, up to
//!   [`DETERMINISTIC_FLASH_KEYS`] of context, past it (and where the flash
//!   kernel does not serve the head shape) the decode kernel with a fixed
//!   number of key splits, a prompt's tokens as token rows: a row's result
//!   depends on the row alone.
//!
//! Costs: O(1) per step.

use kernels::decode_attention::DecodeParams;
use kernels::flash_prefill::FlashTiles;
use kernels::prefill_attention::PrefillParams;
use kernels::{DecodePlan, HeadShape, Kernels};
use ops::attention::ScoreRule;

/// The LM head runs as a GEMV only for this many rows (at one row it
/// matches cuBLAS; beyond, cuBLAS wins).
pub(super) const HEAD_GEMV_ROWS: usize = 1;

/// What a plan depends on besides the step, fixed when the backend is built.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tuning {
    pub shape: HeadShape,
    pub decode: DecodePlan,
    pub block_size: usize,
    pub hidden: usize,
    pub vocab: usize,
    pub num_layers: usize,
    /// Steps of at most this many tokens run the fused GEMV projections
    /// (0: never).
    pub gemv_rows: usize,
    /// Decode steps of at least this many sequences run attention on the
    /// narrow flash tiling (`usize::MAX`: never).
    pub narrow_decode_seqs: usize,
    /// Columns of the LoRA shrink's output per token (0: no LoRA slots).
    pub lora_h: usize,
    /// Columns of every slot's shrink per token on the tensor-core LoRA
    /// path (0: no LoRA slots, or deterministic mode, which does not take it).
    pub lora_wide: usize,
    /// Deterministic mode: every row's reductions fixed whatever the step
    /// (module doc).
    pub deterministic: bool,
    /// One-token decode steps may run their layers on the persistent kernel.
    pub persistent: bool,
    /// Its launches stamp their op timings (`CudaOptions::persistent_trace`).
    pub persistent_trace: bool,
}

/// The kernels' capabilities a plan asks about (the flash kernel's tilings
/// on this device); [`Kernels`] answers them.
pub(super) trait FlashCaps {
    /// The tiling prefill runs with on this device.
    fn prefill_tiles(&self) -> FlashTiles;
    /// Whether `tiles` serves `p`'s head shape on this device.
    fn flash_supports(&self, tiles: FlashTiles, p: &PrefillParams) -> bool;
}

impl FlashCaps for Kernels {
    fn prefill_tiles(&self) -> FlashTiles {
        Kernels::prefill_tiles(self)
    }
    fn flash_supports(&self, tiles: FlashTiles, p: &PrefillParams) -> bool {
        Kernels::flash_supports(self, tiles, p)
    }
}

/// The attention kind of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StepKind {
    /// One token per sequence.
    Decode,
    /// Anything else: the longest segment and the number of one-token
    /// segments (decode rows of a mixed step).
    Prefill { max_seqlen: usize, singles: usize },
}

/// A step as staged: `t` tokens of `s` sequences, `r` rows to sample or
/// return, block-table rows of `max_blocks`; `identity_rows` when the rows
/// are `0, 1, ..` in order.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepShape {
    pub t: usize,
    pub s: usize,
    pub r: usize,
    pub max_blocks: usize,
    pub kind: StepKind,
    pub identity_rows: bool,
    /// Some row runs a LoRA adapter.
    pub lora: bool,
}

/// How a group of projections runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Proj {
    /// Our fused GEMV kernels.
    Gemv,
    /// cuBLAS GEMMs plus the unfused norm / RoPE / SiLU kernels.
    Gemm,
}

/// The attention path of a step.
#[derive(Debug, Clone, Copy)]
pub(super) enum AttnPlan {
    /// The split-KV decode kernel.
    Decode(DecodeParams),
    /// The split-KV decode kernel on every token row (deterministic mode's
    /// prefill and mixed steps where the flash kernel does not serve the
    /// head shape; `num_seqs` counts the rows).
    DecodeTokens(DecodeParams),
    /// Deterministic mode: rows of contexts up to [`DETERMINISTIC_FLASH_KEYS`]
    /// on the flash kernel's [`DETERMINISTIC_TILES`], longer ones on the
    /// decode kernel (`long`: its `min_ctx` just past that; `None` when the
    /// step's block tables cannot reach past it), as token rows unless the
    /// step is pure decode (`tokens` false).
    Fixed {
        p: PrefillParams,
        long: Option<DecodeParams>,
        tokens: bool,
    },
    /// A decode step on the narrow flash tiling.
    Narrow(PrefillParams),
    /// The flash prefill kernel on the device's prefill tiling.
    Flash(PrefillParams),
    /// A mixed step: multi-token segments on `wide`, one-token segments on
    /// the narrow tiling.
    FlashSplit { wide: FlashTiles, p: PrefillParams },
    /// The scalar prefill kernel (head shapes flash does not serve).
    Scalar(PrefillParams),
}

impl AttnPlan {
    /// The same path under layer's `rule` (scale, sliding window): a plan
    /// is per step and its params carry plain causal attention; the
    /// executor runs each layer with its own rule.
    pub fn for_layer(self, rule: ScoreRule) -> AttnPlan {
        let p = |p: PrefillParams| PrefillParams { rule, ..p };
        let d = |d: DecodeParams| DecodeParams { rule, ..d };
        match self {
            AttnPlan::Decode(x) => AttnPlan::Decode(d(x)),
            AttnPlan::DecodeTokens(x) => AttnPlan::DecodeTokens(d(x)),
            AttnPlan::Fixed { p: x, long, tokens } => AttnPlan::Fixed {
                p: p(x),
                long: long.map(d),
                tokens,
            },
            AttnPlan::Narrow(x) => AttnPlan::Narrow(p(x)),
            AttnPlan::Flash(x) => AttnPlan::Flash(p(x)),
            AttnPlan::FlashSplit { wide, p: x } => AttnPlan::FlashSplit { wide, p: p(x) },
            AttnPlan::Scalar(x) => AttnPlan::Scalar(p(x)),
        }
    }
}

/// Where the LM head reads its input rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeadIn {
    /// The normed rows are the sampled rows, in order.
    InPlace,
    /// The sampled rows are gathered first.
    Gather,
}

/// Every kernel choice of one step (module doc).
#[derive(Debug, Clone, Copy)]
pub(super) struct StepPlan {
    pub t: usize,
    pub r: usize,
    pub proj: Proj,
    pub attn: AttnPlan,
    /// The last layer's O projection, MLP and the final norm run on the
    /// `r` sampled rows only.
    pub prune_last: bool,
    pub head_in: HeadIn,
    pub head: Proj,
    /// Some row runs a LoRA adapter: each targeted projection gets its
    /// deltas (`lora`).
    pub lora: bool,
    /// The layers may run as one launch of the persistent decode kernel,
    /// which then replaces the GEMV layers' launches where its recording of
    /// them succeeds (`forward`).
    pub persistent: bool,
}

impl StepPlan {
    /// The plan of a step of shape `st` (module doc).
    pub fn new(tu: &Tuning, caps: &impl FlashCaps, st: StepShape) -> StepPlan {
        let StepShape { t, r, .. } = st;
        let proj = if t >= 1 && t <= tu.gemv_rows && kernels::gemv::fits(t, tu.hidden) {
            Proj::Gemv
        } else {
            Proj::Gemm
        };
        let prune_last = proj == Proj::Gemm
            && !st.lora
            && !st.identity_rows
            && r >= 1
            && r < t
            && tu.vocab >= tu.hidden
            && tu.num_layers >= 1;
        let head_in = if prune_last || (st.identity_rows && r == t) {
            HeadIn::InPlace
        } else {
            HeadIn::Gather
        };
        let head = if r >= 1 && r <= tu.gemv_rows.min(HEAD_GEMV_ROWS) {
            Proj::Gemv
        } else {
            Proj::Gemm
        };
        let attn = attention(tu, caps, st);
        let persistent = tu.persistent
            && t == 1
            && proj == Proj::Gemv
            && !st.lora
            && matches!(attn, AttnPlan::Decode(_));
        StepPlan {
            t,
            r,
            proj,
            attn,
            prune_last,
            head_in,
            head,
            lora: st.lora,
            persistent,
        }
    }
}

/// Deterministic mode's attention tiling: one fixed key tile for every row,
/// no key splits, so a row's result depends on its own keys alone.
pub(super) const DETERMINISTIC_TILES: FlashTiles = FlashTiles::NarrowSmall;

/// Deterministic mode: rows of longer contexts run the decode kernel with
/// its fixed key splits (one unsplit CTA a KV head would read a long
/// context alone); the choice follows the row's own context, so it keeps
/// the guarantee.
pub(super) const DETERMINISTIC_FLASH_KEYS: usize = 2048;

/// Keys at the end of a decode row's context this step may have written
/// before attention: its own, and up to `MAX_DRAFTS` drafts before it when
/// verify rows run as decode rows (`verify`), also in replayed graphs.
const DECODE_FRESH: usize = 1 + contract::backend::MAX_DRAFTS;

/// The attention path of a step of shape `st`.
fn attention(tu: &Tuning, caps: &impl FlashCaps, st: StepShape) -> AttnPlan {
    let prefill = |max_seqlen: usize| PrefillParams {
        shape: tu.shape,
        tokens: st.t,
        num_seqs: st.s,
        max_seqlen,
        max_blocks: st.max_blocks,
        block_size: tu.block_size,
        rule: ScoreRule::causal(tu.shape.head_dim),
    };
    let decode = |rows: usize| DecodeParams {
        shape: tu.shape,
        plan: tu.decode,
        num_seqs: rows,
        max_blocks: st.max_blocks,
        block_size: tu.block_size,
        fresh: DECODE_FRESH,
        min_ctx: 0,
        rule: ScoreRule::causal(tu.shape.head_dim),
    };
    if tu.deterministic {
        // one kernel and one tiling for every row: the fixed-tile flash
        // kernel where it serves the head shape, else the decode kernel
        // (one key split per context) on token rows
        let max_seqlen = match st.kind {
            StepKind::Decode => 1,
            StepKind::Prefill { max_seqlen, .. } => max_seqlen,
        };
        let p = prefill(max_seqlen);
        let tokens = st.kind != StepKind::Decode;
        let rows = if tokens { st.t } else { st.s };
        return match tokens {
            _ if caps.flash_supports(DETERMINISTIC_TILES, &p) => AttnPlan::Fixed {
                p,
                long: (st.max_blocks * tu.block_size > DETERMINISTIC_FLASH_KEYS).then(|| {
                    DecodeParams {
                        min_ctx: DETERMINISTIC_FLASH_KEYS + 1,
                        ..decode(rows)
                    }
                }),
                tokens,
            },
            false => AttnPlan::Decode(decode(rows)),
            true => AttnPlan::DecodeTokens(decode(rows)),
        };
    }
    match st.kind {
        StepKind::Decode => {
            let p = prefill(1);
            if st.s >= tu.narrow_decode_seqs && caps.flash_supports(FlashTiles::Narrow, &p) {
                AttnPlan::Narrow(p)
            } else {
                AttnPlan::Decode(decode(st.s))
            }
        }
        StepKind::Prefill {
            max_seqlen,
            singles,
        } => {
            let p = prefill(max_seqlen);
            let wide = caps.prefill_tiles();
            let flash = caps.flash_supports(wide, &p);
            if flash
                && singles >= tu.narrow_decode_seqs
                && max_seqlen > 1
                && caps.flash_supports(FlashTiles::Narrow, &p)
            {
                AttnPlan::FlashSplit { wide, p }
            } else if flash {
                AttnPlan::Flash(p)
            } else {
                AttnPlan::Scalar(p)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device whose flash tilings serve every head shape (`flash`) or none.
    struct Caps {
        flash: bool,
    }

    impl FlashCaps for Caps {
        fn prefill_tiles(&self) -> FlashTiles {
            FlashTiles::Hopper
        }
        fn flash_supports(&self, _: FlashTiles, _: &PrefillParams) -> bool {
            self.flash
        }
    }

    fn tuning() -> Tuning {
        Tuning {
            shape: HeadShape {
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 64,
            },
            decode: DecodePlan {
                target_blocks: 264,
                min_chunk: 64,
                fixed_splits: 0,
            },
            block_size: 16,
            hidden: 2048,
            vocab: 128_256,
            num_layers: 16,
            gemv_rows: 2,
            narrow_decode_seqs: 66,
            lora_h: 0,
            lora_wide: 0,
            deterministic: false,
            persistent: false,
            persistent_trace: false,
        }
    }

    /// The persistent kernel is offered one-token decode steps of the GEMV
    /// path without adapter rows, and only when enabled.
    #[test]
    fn persistent_decode_takes_one_token_gemv_decode_steps() {
        let on = Tuning {
            persistent: true,
            ..tuning()
        };
        let caps = Caps { flash: true };
        assert!(!StepPlan::new(&tuning(), &caps, decode(1)).persistent);
        assert!(StepPlan::new(&on, &caps, decode(1)).persistent);
        assert!(!StepPlan::new(&on, &caps, decode(2)).persistent);
        assert!(!StepPlan::new(&on, &caps, prefill(600, 1, 0)).persistent);
        let lora = StepShape {
            lora: true,
            ..decode(1)
        };
        assert!(!StepPlan::new(&on, &caps, lora).persistent);
    }

    fn decode(s: usize) -> StepShape {
        StepShape {
            t: s,
            s,
            r: s,
            max_blocks: 16,
            kind: StepKind::Decode,
            identity_rows: true,
            lora: false,
        }
    }

    fn prefill(t: usize, r: usize, singles: usize) -> StepShape {
        StepShape {
            t,
            s: singles + 1,
            r,
            max_blocks: 128,
            kind: StepKind::Prefill {
                max_seqlen: t - singles,
                singles,
            },
            identity_rows: false,
            lora: false,
        }
    }

    /// Every path a plan takes runs each layer under that layer's rule.
    #[test]
    fn each_layer_runs_its_own_score_rule() {
        let rule = ScoreRule {
            scale: 0.0625,
            softcap: None,
            window: Some(512),
        };
        let det = Tuning {
            deterministic: true,
            ..tuning()
        };
        let (on, off) = (Caps { flash: true }, Caps { flash: false });
        let plans = [
            StepPlan::new(&tuning(), &on, decode(1)),
            StepPlan::new(&tuning(), &on, decode(256)),
            StepPlan::new(&tuning(), &on, prefill(600, 80, 70)),
            StepPlan::new(&tuning(), &on, prefill(600, 10, 8)),
            StepPlan::new(&tuning(), &off, prefill(600, 10, 8)),
            StepPlan::new(&det, &on, prefill(600, 10, 8)),
            StepPlan::new(&det, &off, prefill(600, 10, 8)),
            StepPlan::new(&det, &off, decode(3)),
        ];
        for plan in plans {
            let causal = ScoreRule::causal(64);
            let rules = |a: AttnPlan| -> Vec<ScoreRule> {
                match a {
                    AttnPlan::Decode(d) | AttnPlan::DecodeTokens(d) => vec![d.rule],
                    AttnPlan::Fixed { p, long, .. } => [Some(p.rule), long.map(|d| d.rule)]
                        .into_iter()
                        .flatten()
                        .collect(),
                    AttnPlan::Narrow(p)
                    | AttnPlan::Flash(p)
                    | AttnPlan::FlashSplit { p, .. }
                    | AttnPlan::Scalar(p) => vec![p.rule],
                }
            };
            assert!(rules(plan.attn).iter().all(|r| *r == causal));
            let layer = rules(plan.attn.for_layer(rule));
            assert!(
                !layer.is_empty() && layer.iter().all(|r| *r == rule),
                "{:?}",
                plan.attn
            );
        }
    }

    #[test]
    fn small_decode_runs_the_fused_gemvs_and_the_head_gemv() {
        let p = StepPlan::new(&tuning(), &Caps { flash: true }, decode(1));
        assert_eq!(
            (p.proj, p.head, p.head_in),
            (Proj::Gemv, Proj::Gemv, HeadIn::InPlace)
        );
        assert!(matches!(p.attn, AttnPlan::Decode(d) if d.num_seqs == 1));
        assert!(!p.prune_last);
        let p = StepPlan::new(&tuning(), &Caps { flash: true }, decode(2));
        assert_eq!((p.proj, p.head), (Proj::Gemv, Proj::Gemm));
        let p = StepPlan::new(&tuning(), &Caps { flash: true }, decode(3));
        assert_eq!(p.proj, Proj::Gemm);
    }

    #[test]
    fn large_decode_moves_to_the_narrow_tiling_where_it_serves() {
        let tu = tuning();
        let at = |s, flash| StepPlan::new(&tu, &Caps { flash }, decode(s)).attn;
        assert!(matches!(at(65, true), AttnPlan::Decode(_)));
        assert!(matches!(at(66, true), AttnPlan::Narrow(p) if p.max_seqlen == 1));
        assert!(matches!(at(256, false), AttnPlan::Decode(_)));
        let never = Tuning {
            narrow_decode_seqs: usize::MAX,
            ..tu
        };
        let p = StepPlan::new(&never, &Caps { flash: true }, decode(256));
        assert!(matches!(p.attn, AttnPlan::Decode(_)));
    }

    #[test]
    fn prefill_prunes_the_last_layer_to_the_sampled_rows() {
        let tu = tuning();
        let p = StepPlan::new(&tu, &Caps { flash: true }, prefill(2048, 1, 0));
        assert_eq!((p.proj, p.head_in), (Proj::Gemm, HeadIn::InPlace));
        assert!(p.prune_last);
        assert!(matches!(p.attn, AttnPlan::Flash(q) if q.max_seqlen == 2048));
        // every row sampled: nothing to prune, the rows gathered for the head
        let p = StepPlan::new(&tu, &Caps { flash: true }, prefill(64, 64, 63));
        assert!(!p.prune_last);
        assert_eq!(p.head_in, HeadIn::Gather);
        // no sampled row (a logits-free chunk): nothing pruned either
        let p = StepPlan::new(&tu, &Caps { flash: true }, prefill(64, 0, 0));
        assert!(!p.prune_last);
    }

    #[test]
    fn mixed_steps_split_their_decode_rows_and_fall_back_without_flash() {
        let tu = tuning();
        let p = StepPlan::new(&tu, &Caps { flash: true }, prefill(600, 80, 70));
        assert!(matches!(
            p.attn,
            AttnPlan::FlashSplit {
                wide: FlashTiles::Hopper,
                ..
            }
        ));
        let p = StepPlan::new(&tu, &Caps { flash: true }, prefill(600, 10, 8));
        assert!(matches!(p.attn, AttnPlan::Flash(_)));
        let p = StepPlan::new(&tu, &Caps { flash: false }, prefill(600, 80, 70));
        assert!(matches!(p.attn, AttnPlan::Scalar(_)));
    }

    #[test]
    fn lora_steps_keep_every_row_to_the_end() {
        let tu = tuning();
        let st = StepShape {
            lora: true,
            ..prefill(2048, 1, 0)
        };
        let p = StepPlan::new(&tu, &Caps { flash: true }, st);
        assert!(p.lora && !p.prune_last);
        let p = StepPlan::new(&tu, &Caps { flash: true }, prefill(2048, 1, 0));
        assert!(!p.lora && p.prune_last);
        let d = StepShape {
            lora: true,
            ..decode(1)
        };
        let p = StepPlan::new(&tu, &Caps { flash: true }, d);
        assert_eq!((p.proj, p.lora), (Proj::Gemv, true));
    }

    #[test]
    fn deterministic_steps_run_the_gemms_and_the_decode_kernel_on_every_row() {
        let tu = Tuning {
            deterministic: true,
            gemv_rows: 0,
            decode: tuning().decode.invariant(),
            ..tuning()
        };
        for flash in [true, false] {
            let caps = Caps { flash };
            let p = StepPlan::new(&tu, &caps, decode(1));
            assert_eq!((p.proj, p.head), (Proj::Gemm, Proj::Gemm));
            // batch 1, past the point where default steps move to the
            // narrow tiling, prefill and mixed steps: one path
            // and with block tables that reach past the flash limit
            let far = |st: StepShape| StepShape {
                max_blocks: 200,
                ..st
            };
            let steps = [
                decode(1),
                decode(256),
                prefill(2048, 1, 0),
                prefill(600, 80, 70),
            ];
            for st in steps
                .into_iter()
                .chain([far(decode(4)), far(prefill(600, 80, 70))])
            {
                let a = StepPlan::new(&tu, &caps, st).attn;
                let decode_step = matches!(st.kind, StepKind::Decode);
                let ok = match a {
                    AttnPlan::Fixed { p, long, tokens } => {
                        let rows = if decode_step { st.s } else { st.t };
                        // long rows only where the tables reach past the flash limit
                        let reach = st.max_blocks * tu.block_size > DETERMINISTIC_FLASH_KEYS;
                        let long_ok = match long {
                            Some(l) => {
                                reach
                                    && l.num_seqs == rows
                                    && l.min_ctx == DETERMINISTIC_FLASH_KEYS + 1
                            }
                            None => !reach,
                        };
                        flash && p.tokens == st.t && tokens != decode_step && long_ok
                    }
                    AttnPlan::Decode(d) => !flash && decode_step && d.num_seqs == st.s,
                    AttnPlan::DecodeTokens(d) => !flash && !decode_step && d.num_seqs == st.t,
                    _ => false,
                };
                assert!(ok, "flash {flash}: {st:?} ran {a:?}");
            }
        }
        // the same key splits at every batch size
        let splits = |s| tu.decode.splits(tu.shape, s);
        assert_eq!(splits(1), splits(256));
    }

    #[test]
    fn decode_rows_leave_room_for_drafts_written_this_step() {
        let p = StepPlan::new(&tuning(), &Caps { flash: true }, decode(4));
        assert!(
            matches!(p.attn, AttnPlan::Decode(d) if d.fresh == 1 + contract::backend::MAX_DRAFTS)
        );
    }

    #[test]
    fn no_gemv_when_turned_off_or_too_wide() {
        let off = Tuning {
            gemv_rows: 0,
            ..tuning()
        };
        let p = StepPlan::new(&off, &Caps { flash: true }, decode(1));
        assert_eq!((p.proj, p.head), (Proj::Gemm, Proj::Gemm));
        let wide = Tuning {
            hidden: 1 << 20,
            ..tuning()
        };
        let p = StepPlan::new(&wide, &Caps { flash: true }, decode(1));
        assert_eq!(p.proj, Proj::Gemm);
    }
}
