//! A llama or gemma3 GGUF's quantised projection matrices kept in their blocks, for
//! backends that multiply with them directly (the CPU's Q8_0 / Q4_1 / Q4_K /
//! Q6_K path).
//!
//! Contract: [`keep_blocks`] reads the GGUF at `path` and, for every layer
//! projection (Q, K, V, O, gate, up, down) and the LM head (the untied
//! `output.weight`, else the tied `token_embd.weight`) whose type is one
//! of `keep`, replaces the model's projection (the BF16 copy the store
//! imported) by a [`Projection::Blocks`] of the tensor's raw blocks; the
//! others stay as they were. Shapes are checked
//! against `cfg` (a tensor missing or of another shape is an error naming
//! it); the row length must be a whole number of blocks. Blocks are copied
//! byte for byte; only llama.cpp's Q/K row permutation of Llama is undone (whole
//! rows of blocks moved, as [`crate::gguf::import_to_dir`] does for the
//! dequantised rows), so row `r` is Hugging Face's row `r`.
//!
//! The file may have changed since the store imported (and checked) it, so
//! every kept tensor's blocks are checked again as they are read: a weight
//! that decodes to NaN, an infinity or a magnitude past
//! [`crate::weights::MAX_ABS_WEIGHT`] is an error naming the tensor.
//!
//! Costs: one read of the kept tensors (a memory map of the file, dropped
//! on return) and one decode of them for the check, spread over the cores;
//! memory is their quantised size (the BF16 copies they replace are
//! dropped).

use crate::gguf::{Arch, GgmlType, Gguf, GgufError, TensorInfo, dequantize};
use crate::projection::Projection;
use crate::weights::{MAX_ABS_WEIGHT, ModelWeights, implausible};
use contract::config::ModelConfig;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// One matrix in ggml blocks: `[rows, cols]`, `rows` rows of whole blocks
/// of `ty`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantTensor {
    /// Hugging Face name.
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub ty: GgmlType,
    pub data: Vec<u8>,
}

/// Replaces the projections of `weights` (the model `cfg` the store
/// imported from the GGUF at `path`) that the GGUF holds in a type of
/// `keep` by their blocks (see the module doc); returns how many. On an
/// error some may be replaced already: the caller drops `weights`.
pub fn keep_blocks(
    path: &Path,
    cfg: &ModelConfig,
    weights: &mut ModelWeights,
    keep: &[GgmlType],
) -> Result<usize, GgufError> {
    if weights.layers.len() != cfg.num_layers {
        return Err(GgufError::Tensor {
            tensor: "model.layers".into(),
            reason: format!(
                "the model holds {} layers, the config {}",
                weights.layers.len(),
                cfg.num_layers
            ),
        });
    }
    let io = |source| GgufError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: read-only private map, read once here; a file changed
    // underneath gives wrong weights or a parse error, never UB in safe
    // code that only indexes through bounds-checked slices.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    let g = Gguf::parse(&map, &path.display().to_string())?;
    let arch = Arch::of(&g)?;
    let by_hf: HashMap<String, &TensorInfo> = g
        .tensors
        .iter()
        .filter_map(|t| arch.hf_name(&t.name).map(|n| (n, t)))
        .collect();
    let get = |name: &str, rows: usize, cols: usize, heads: Option<usize>| {
        let t = *by_hf.get(name).ok_or_else(|| GgufError::Tensor {
            tensor: name.to_string(),
            reason: format!("missing from {}", g.path),
        })?;
        if t.shape() != [rows, cols] {
            return Err(GgufError::Tensor {
                tensor: t.name.clone(),
                reason: format!(
                    "shape {:?} does not match the config's [{rows}, {cols}]",
                    t.shape()
                ),
            });
        }
        if !keep.contains(&t.ty) {
            return Ok(None);
        }
        let bytes = g.tensor_bytes(&map, t)?;
        let mut data = bytes.to_vec();
        if let Some(heads) = heads.filter(|_| arch.permutes_qk()) {
            data = unpermute_row_bytes(&data, rows, heads).map_err(|reason| GgufError::Tensor {
                tensor: t.name.clone(),
                reason,
            })?;
        }
        if let Err(why) = t.ty.byte_size(cols) {
            return Err(GgufError::Tensor {
                tensor: t.name.clone(),
                reason: format!("its rows: {why}"),
            });
        }
        check_blocks(t.ty, &data, rows, cols).map_err(|reason| GgufError::Tensor {
            tensor: t.name.clone(),
            reason: format!("in {}: {reason}", g.path),
        })?;
        Ok(Some(QuantTensor {
            name: name.to_string(),
            rows,
            cols,
            ty: t.ty,
            data,
        }))
    };
    let (h, q, kv, i) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
    );
    let mut kept = 0;
    let mut put = |slot: &mut Projection, t: Option<QuantTensor>| {
        if let Some(t) = t {
            *slot = Projection::Blocks(t);
            kept += 1;
        }
    };
    for (l, lw) in weights.layers.iter_mut().enumerate() {
        let p = format!("model.layers.{l}.");
        let name = |s: &str| format!("{p}{s}");
        let heads = (Some(cfg.num_heads), Some(cfg.num_kv_heads));
        put(
            &mut lw.q_proj,
            get(&name("self_attn.q_proj.weight"), q, h, heads.0)?,
        );
        put(
            &mut lw.k_proj,
            get(&name("self_attn.k_proj.weight"), kv, h, heads.1)?,
        );
        put(
            &mut lw.v_proj,
            get(&name("self_attn.v_proj.weight"), kv, h, None)?,
        );
        put(
            &mut lw.o_proj,
            get(&name("self_attn.o_proj.weight"), h, q, None)?,
        );
        put(
            &mut lw.gate_proj,
            get(&name("mlp.gate_proj.weight"), i, h, None)?,
        );
        put(
            &mut lw.up_proj,
            get(&name("mlp.up_proj.weight"), i, h, None)?,
        );
        put(
            &mut lw.down_proj,
            get(&name("mlp.down_proj.weight"), h, i, None)?,
        );
    }
    let head_name = if by_hf.contains_key("lm_head.weight") {
        "lm_head.weight"
    } else {
        "model.embed_tokens.weight"
    };
    // a tied head in blocks is the head's own copy: the embedding stays BF16
    if let Some(t) = get(head_name, cfg.vocab_size, h, None)? {
        weights.lm_head = Some(Projection::Blocks(t));
        kept += 1;
    }
    Ok(kept)
}

/// Rows decoded per task of the block check.
const CHECK_ROWS: usize = 64;

/// Decodes `data` (`rows` rows of `cols` weights of `ty`) and refuses the
/// first implausible weight, by its flat index.
fn check_blocks(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Result<(), String> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let row_bytes = data.len() / rows;
    let found = data
        .par_chunks(row_bytes * CHECK_ROWS)
        .enumerate()
        .map(|(c, chunk)| {
            let n = chunk.len() / row_bytes * cols;
            let values = dequantize(ty, chunk, n)?;
            Ok(values
                .iter()
                .position(|&x| implausible(x))
                .map(|i| (c * CHECK_ROWS * cols + i, values[i])))
        })
        .collect::<Result<Vec<_>, String>>()?;
    match found.into_iter().flatten().min_by_key(|&(i, _)| i) {
        Some((i, v)) => Err(format!(
            "weight {i} decodes to {v}, not a finite value within ±{MAX_ABS_WEIGHT}; the file is damaged"
        )),
        None => Ok(()),
    }
}

/// Undoes llama.cpp's Q/K row permutation on whole rows of bytes (`rows`
/// rows over `heads` heads): GGUF row `h·hd + 2i + j` becomes row `h·hd +
/// j·hd/2 + i`, as [`crate::gguf::unpermute_rows`].
fn unpermute_row_bytes(data: &[u8], rows: usize, heads: usize) -> Result<Vec<u8>, String> {
    if rows == 0
        || heads == 0
        || !rows.is_multiple_of(heads)
        || !(rows / heads).is_multiple_of(2)
        || !data.len().is_multiple_of(rows)
    {
        return Err(format!("cannot unpermute {rows} rows over {heads} heads"));
    }
    let rb = data.len() / rows;
    let (hd, half) = (rows / heads, rows / heads / 2);
    let mut out = vec![0u8; data.len()];
    for (r, dst) in out.chunks_exact_mut(rb).enumerate() {
        let (h, within) = (r / hd, r % hd);
        let (j, i) = (within / half, within % half);
        let src = h * hd + 2 * i + j;
        dst.copy_from_slice(&data[src * rb..(src + 1) * rb]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_rows_are_unpermuted_like_the_f32_rows() {
        let (rows, cols, heads) = (8, 3, 2);
        let f: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        let want = crate::gguf::unpermute_rows(&f, rows, cols, heads).unwrap();
        let bytes: Vec<u8> = (0..rows * cols).map(|v| v as u8).collect();
        let got = unpermute_row_bytes(&bytes, rows, heads).unwrap();
        assert_eq!(got.iter().map(|&b| b as f32).collect::<Vec<_>>(), want);
        assert!(unpermute_row_bytes(&bytes, 8, 3).is_err());
    }

    /// Q8_0 rows of one block each: a NaN, infinite or huge block scale in
    /// any row is refused naming the weight's flat index.
    #[test]
    fn block_scales_are_checked() {
        let rows = 3 * CHECK_ROWS;
        let block = |d: f32| {
            let mut b = half::f16::from_f32(d).to_le_bytes().to_vec();
            b.extend((0..32).map(|i| (i as i8 - 16) as u8));
            b
        };
        let clean: Vec<u8> = (0..rows).flat_map(|_| block(0.01)).collect();
        assert!(check_blocks(GgmlType::Q8_0, &clean, rows, 32).is_ok());
        for (row, d) in [
            (0, f32::NAN),
            (CHECK_ROWS + 1, f32::INFINITY),
            (rows - 1, 1000.0),
        ] {
            let mut data = clean.clone();
            data[row * 34..row * 34 + 34].copy_from_slice(&block(d));
            let e = check_blocks(GgmlType::Q8_0, &data, rows, 32).unwrap_err();
            assert!(e.contains(&format!("weight {}", row * 32)), "{e}");
        }
    }
}
