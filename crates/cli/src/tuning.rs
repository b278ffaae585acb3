//! The backends' tuning knobs as (hidden) command-line flags: the
//! libraries take them as typed options from here, never from the
//! environment. The defaults are the measured best; the flags exist for
//! measurements and comparisons (`docs/performance.md`).

use anyhow::{Result, bail};
use model::cuda::{CudaOptions, DEFAULT_GEMV_ROWS, MAX_GEMV_ROWS};

/// Tuning flags of the CUDA backend.
#[derive(clap::Args, Clone, Debug)]
pub struct TuningArgs {
    /// Run pure-decode steps eagerly instead of replaying captured CUDA graphs.
    #[arg(long, hide = true, env = "LAMINA_NO_CUDA_GRAPHS", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_cuda_graphs: bool,
    /// Largest CUDA step (tokens) run on the fused GEMV projections; 0:
    /// cuBLAS always.
    #[arg(long, hide = true, default_value_t = DEFAULT_GEMV_ROWS, env = "LAMINA_GEMV_ROWS")]
    pub gemv_rows: usize,
    /// CUDA decode steps of at least this many sequences run attention on
    /// the narrow flash tiling; 0: never [default: from the SM count].
    #[arg(long, hide = true, env = "LAMINA_NARROW_DECODE_SEQS")]
    pub narrow_decode_seqs: Option<usize>,
}

impl TuningArgs {
    /// The CUDA backend's options, or an error naming the flag out of range.
    pub fn cuda_options(&self) -> Result<CudaOptions> {
        let most = MAX_GEMV_ROWS;
        if self.gemv_rows > most {
            bail!(
                "invalid `--gemv-rows`: {} is more than the GEMV kernels take ({most})",
                self.gemv_rows
            );
        }
        Ok(CudaOptions {
            graphs: !self.no_cuda_graphs,
            gemv_rows: self.gemv_rows,
            narrow_decode_seqs: self.narrow_decode_seqs,
        })
    }
}
