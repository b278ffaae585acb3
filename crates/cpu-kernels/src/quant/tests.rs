use super::*;

/// `n` bytes of a xorshift sequence from `seed` (random bits for block
/// layouts).
pub(super) fn random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

fn rand_vec(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

const TYPES: [QuantType; 4] = [
    QuantType::Q8_0,
    QuantType::Q4_1,
    QuantType::Q4_K,
    QuantType::Q6_K,
];

/// The shapes of `shapes` whose rows are whole `qt` blocks (at least one).
fn fitting(qt: QuantType, shapes: &[(usize, usize, usize)]) -> Vec<(usize, usize, usize)> {
    let v: Vec<_> = shapes
        .iter()
        .copied()
        .filter(|s| s.1.is_multiple_of(qt.block_len()))
        .collect();
    assert!(!v.is_empty(), "no shape for {qt:?}");
    v
}

fn quantized(qt: QuantType, w: &[f32], inp: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for row in w.chunks_exact(inp) {
        quantize_row(qt, row, &mut out);
    }
    out
}

#[test]
fn quantize_then_dequantize_is_within_half_a_step() {
    let inp = 768;
    let w = rand_vec(3 * inp, 7, 2.0);
    for qt in TYPES {
        let bytes = quantized(qt, &w, inp);
        assert_eq!(bytes.len(), qt.matrix_bytes(3, inp));
        let mut back = vec![0f32; w.len()];
        for (r, o) in back.chunks_exact_mut(inp).enumerate() {
            let rb = qt.matrix_bytes(1, inp);
            dequantize_row(qt, &bytes[r * rb..(r + 1) * rb], o);
        }
        let range = |v: &[f32]| {
            v.iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)))
        };
        for (b, (wb, ob)) in w.chunks_exact(QK).zip(back.chunks_exact(QK)).enumerate() {
            let (lo, hi) = range(wb);
            let step = match qt {
                QuantType::Q8_0 => lo.abs().max(hi.abs()) / 127.0,
                QuantType::Q4_1 => (hi - lo) / 15.0,
                // plus the 6-bit rounding of the step (up to half of the
                // super-block's largest step / 63, on 15 steps) and of the
                // minimum (half of the largest minimum / 63), as a fraction
                // of half this step
                QuantType::Q4_K => {
                    let sb = &w[b / 8 * 256..][..256];
                    let (slo, shi) = range(sb);
                    let big = sb.chunks_exact(QK).fold(0f32, |m, v| {
                        let (l, h) = range(v);
                        m.max(h - l.min(0.0))
                    }) / 15.0;
                    (hi - lo.min(0.0)) / 15.0
                        + 2.0 * (15.0 * big / 63.0 + slo.abs().max(shi.abs()) / 63.0)
                }
                // plus the scale's rounding to an i8 multiple of the
                // super-block's largest step / 127, on up to 32 steps
                QuantType::Q6_K => {
                    let sb = &w[b / 8 * 256..][..256];
                    let (slo, shi) = range(sb);
                    let big = slo.abs().max(shi.abs()) / 32.0;
                    lo.abs().max(hi.abs()) / 32.0 + 2.0 * 16.0 * big / 127.0
                }
            };
            for (&a, &o) in wb.iter().zip(ob) {
                // half a step, plus the f16 rounding of the scale and minimum
                assert!(
                    (a - o).abs() <= 0.5 * step + 2e-3 * hi.abs().max(lo.abs()),
                    "{qt:?} block {b}: {a} vs {o}"
                );
            }
        }
    }
}

/// Every kernel against the portable one and against the exact product of
/// the dequantised weights with the unquantised activations.
#[test]
fn every_kernel_matches_the_reference_on_random_rows() {
    let kernels = Kernel::available();
    assert_eq!(kernels[0], Kernel::Portable);
    let shapes = [
        (1, 32, 5),
        (3, 64, 9),
        (5, 576, 33),
        (17, 160, 70),
        (2, 256, 7),
        (6, 768, 19),
    ];
    for qt in TYPES {
        for (i, &(t, inp, out)) in fitting(qt, &shapes).iter().enumerate() {
            let x = rand_vec(t * inp, 100 + i as u64, 3.0);
            let wf = rand_vec(out * inp, 200 + i as u64, 0.5);
            let w = quantized(qt, &wf, inp);
            let rb = qt.matrix_bytes(1, inp);
            let mut acts = QuantActs::default();
            acts.quantize_grouped(&x, inp, qt.act_group());
            for n in 0..t {
                for r in 0..out {
                    let wr = &w[r * rb..(r + 1) * rb];
                    let want = Kernel::Portable.dot(qt, wr, acts.row(n));
                    for &k in &kernels[1..] {
                        let got = k.dot(qt, wr, acts.row(n));
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{k:?} {qt:?} t={n} r={r}: {got} vs {want}"
                        );
                    }
                    // against f64 over the dequantised weights and exact x
                    let mut deq = vec![0f32; inp];
                    dequantize_row(qt, wr, &mut deq);
                    let exact: f64 = deq
                        .iter()
                        .zip(&x[n * inp..(n + 1) * inp])
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    // activation rounding: half of 3/32767 per element, times
                    // |w|, plus f32 rounding of the sum
                    let bound: f64 =
                        deq.iter().map(|a| a.abs() as f64).sum::<f64>() * (1.5 / 32767.0 + 1e-6);
                    assert!(
                        (want as f64 - exact).abs() <= bound,
                        "{qt:?} t={n} r={r}: {want} vs exact {exact} (bound {bound})"
                    );
                }
            }
        }
    }
}

/// `matmul_quant` on every ISA, few and many tokens, serial and parallel:
/// the dots' results, and the exact product of the dequantised weights
/// within the activations' 16-bit rounding.
#[test]
fn matmul_matches_the_dots_and_the_exact_product_on_every_isa() {
    let shapes = [
        (1, 64, 7),
        (4, 576, 300),
        (20, 128, 64),
        (33, 96, 70),
        (1, 512, 9),
        (13, 1024, 130),
    ];
    for qt in TYPES {
        for &(t, inp, out) in &fitting(qt, &shapes) {
            let x = rand_vec(t * inp, 5, 1.0);
            let wf = rand_vec(out * inp, 6, 0.1);
            let w = quantized(qt, &wf, inp);
            let rb = qt.matrix_bytes(1, inp);
            let mut acts = QuantActs::default();
            acts.quantize_grouped(&x, inp, qt.act_group());
            let mut deq = vec![0f32; out * inp];
            for (r, d) in deq.chunks_exact_mut(inp).enumerate() {
                dequantize_row(qt, &w[r * rb..(r + 1) * rb], d);
            }
            for isa in Isa::available() {
                let mut y = vec![f32::NAN; t * out];
                matmul_quant(isa, &x, &w, qt, inp, out, &mut y, &mut QuantActs::default());
                for n in 0..t {
                    for r in 0..out {
                        let got = y[n * out + r];
                        let (dr, xn) = (&deq[r * inp..(r + 1) * inp], &x[n * inp..(n + 1) * inp]);
                        let exact: f64 =
                            dr.iter().zip(xn).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let mass: f64 =
                            dr.iter().zip(xn).map(|(&a, &b)| (a * b).abs() as f64).sum();
                        assert!(
                            (got as f64 - exact).abs() <= mass * (1.5 / 32767.0 + 1e-6) + 1e-6,
                            "{isa:?} {qt:?} ({n},{r}): {got} vs exact {exact}"
                        );
                        let want = Kernel::Portable.dot(qt, &w[r * rb..(r + 1) * rb], acts.row(n));
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{isa:?} {qt:?} ({n},{r}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn zero_blocks_quantize_to_zero_without_nan() {
    let x = vec![0f32; 256];
    let mut acts = QuantActs::default();
    acts.quantize_grouped(&x, 256, 256);
    for qt in TYPES {
        let w = quantized(qt, &vec![0.25f32; 256], 256);
        for k in Kernel::available() {
            assert_eq!(k.dot(qt, &w, acts.row(0)), 0.0, "{k:?} {qt:?}");
        }
        // zero weights: scales of 0, no division by them
        let w = quantized(qt, &vec![0f32; 256], 256);
        let mut back = vec![f32::NAN; 256];
        dequantize_row(qt, &w, &mut back);
        assert!(back.iter().all(|&v| v == 0.0), "{qt:?}");
    }
}

/// Tiles of several tokens give bit for bit what one token at a time gives
/// on the same kernel (a sequence's logits must not depend on its batch).
#[test]
fn token_tiles_equal_single_tokens_bit_for_bit() {
    let (t, inp, out) = (9, 512, 37);
    let x = rand_vec(t * inp, 11, 2.0);
    let wf = rand_vec(out * inp, 12, 0.3);
    for qt in TYPES {
        let w = quantized(qt, &wf, inp);
        let rb = qt.matrix_bytes(1, inp);
        let mut acts = QuantActs::default();
        acts.quantize_grouped(&x, inp, qt.act_group());
        for isa in Isa::available() {
            let k = Kernel::pick(isa);
            let mut y = vec![f32::NAN; t * out];
            matmul_quant(isa, &x, &w, qt, inp, out, &mut y, &mut QuantActs::default());
            for n in 0..t {
                for r in 0..out {
                    let one = k.dot(qt, &w[r * rb..(r + 1) * rb], acts.row(n));
                    assert_eq!(
                        y[n * out + r].to_bits(),
                        one.to_bits(),
                        "{k:?} {qt:?} ({n},{r})"
                    );
                }
            }
        }
    }
}

/// Super-blocks of random bits (negative Q6_K scales, every Q4_K scale and
/// minimum, beyond what the reference quantisers write): every kernel, the
/// prompt GEMM and the portable reference agree, and match the exact
/// product of the dequantised weights.
#[test]
fn k_types_of_random_bits_match_on_every_kernel() {
    let (t, inp, out) = (5, 512, 11);
    let x = rand_vec(t * inp, 31, 2.0);
    for qt in [QuantType::Q4_K, QuantType::Q6_K] {
        let bb = qt.block_bytes();
        let mut w = random_bytes(qt.matrix_bytes(out, inp), 0x2545_f491_4f6c_dd1d);
        for (b, block) in w.chunks_exact_mut(bb).enumerate() {
            let d = f16::from_f32(0.001 * (1 + b % 5) as f32).to_le_bytes();
            let dmin = f16::from_f32(0.002 * (1 + b % 3) as f32).to_le_bytes();
            match qt {
                QuantType::Q4_K => block[..4].copy_from_slice(&[d[0], d[1], dmin[0], dmin[1]]),
                _ => block[bb - 2..].copy_from_slice(&d),
            }
        }
        let rb = qt.matrix_bytes(1, inp);
        let mut acts = QuantActs::default();
        acts.quantize_grouped(&x, inp, qt.act_group());
        let mut gemm = vec![f32::NAN; t * out];
        if gemm::supported() {
            gemm::matmul_quant_gemm(&x, &w, qt, inp, out, &mut gemm, &mut QuantActs::default());
        }
        for n in 0..t {
            for r in 0..out {
                let wr = &w[r * rb..(r + 1) * rb];
                let mut deq = vec![0f32; inp];
                dequantize_row(qt, wr, &mut deq);
                let xn = &x[n * inp..(n + 1) * inp];
                let exact: f64 = deq.iter().zip(xn).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mass: f64 = deq.iter().map(|a| a.abs() as f64).sum();
                let want = Kernel::Portable.dot(qt, wr, acts.row(n));
                assert!(
                    (want as f64 - exact).abs() <= mass * (2.0 / 32767.0),
                    "{qt:?} ({n},{r}): {want} vs exact {exact}"
                );
                for k in Kernel::available() {
                    let got = k.dot(qt, wr, acts.row(n));
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{k:?} {qt:?} ({n},{r}): {got} vs {want}"
                    );
                }
                if gemm::supported() {
                    let g = gemm[n * out + r];
                    assert!(
                        (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "gemm {qt:?} ({n},{r}): {g} vs {want}"
                    );
                }
            }
        }
    }
}

/// The 16-row panels give the reference dots' values (the same integer
/// sums, another f32 order) for random blocks, one and many tokens, on one
/// thread and on the pool; a row's result is the same bits whatever `T`.
#[test]
fn panels_of_16_rows_match_the_reference_dots() {
    if !crate::isa::test_runs_here(
        x16::supported(),
        "quant::tests::panels_of_16_rows_match_the_reference_dots",
        "AVX-512 VNNI",
    ) {
        return;
    }
    for qt in [QuantType::Q4_1, QuantType::Q8_0] {
        for (i, &(t, inp, out)) in [(1, 32, 16), (3, 576, 48), (7, 1536, 64), (2, 64, 512)]
            .iter()
            .enumerate()
        {
            let x = rand_vec(t * inp, 300 + i as u64, 3.0);
            let mut w = random_bytes(qt.matrix_bytes(out, inp), 400 + i as u64);
            // finite scales: every block's f16 d (and m) small and normal
            let bb = qt.block_bytes();
            for blk in w.chunks_exact_mut(bb) {
                blk[1] = 0x20 | (blk[1] & 0x83);
                if qt == QuantType::Q4_1 {
                    blk[3] = 0x20 | (blk[3] & 0x83);
                }
            }
            let p = x16::Panels16::new(qt, &w, out, inp).expect("a panel type and shape");
            assert_eq!(p.bytes(), w.len());
            let mut y = vec![0f32; t * out];
            let mut acts = QuantActs::default();
            x16::matmul_x16(&x, &p, &mut y, &mut acts);
            let rb = qt.matrix_bytes(1, inp);
            for n in 0..t {
                for r in 0..out {
                    let want = Kernel::Portable.dot(qt, &w[r * rb..][..rb], acts.row(n));
                    let got = y[n * out + r];
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{qt:?} t={n} r={r}: {got} vs {want}"
                    );
                }
                // the same row alone: the same bits
                let mut y1 = vec![0f32; out];
                x16::matmul_x16(&x[n * inp..][..inp], &p, &mut y1, &mut QuantActs::default());
                assert_eq!(y1, y[n * out..][..out], "{qt:?} row {n} alone");
            }
        }
    }
    assert!(x16::Panels16::new(QuantType::Q4_1, &[0; 20 * 8], 8, 32).is_none());
    assert!(x16::Panels16::new(QuantType::Q4_K, &[0; 144 * 16], 16, 256).is_none());
}

/// The prompt GEMM over 16-row panels gives the bits of the GEMM over the
/// blocks, including a last panel of 16 rows (`out` not a multiple of 32).
#[test]
fn the_gemm_over_panels_equals_the_gemm_over_blocks() {
    if !crate::isa::test_runs_here(
        x16::supported(),
        "quant::tests::the_gemm_over_panels_equals_the_gemm_over_blocks",
        "AVX-512 VNNI",
    ) {
        return;
    }
    for qt in [QuantType::Q4_1, QuantType::Q8_0] {
        for (i, &(t, inp, out)) in [(1, 32, 16), (9, 576, 48), (13, 96, 64)].iter().enumerate() {
            let x = rand_vec(t * inp, 500 + i as u64, 3.0);
            let wf = rand_vec(out * inp, 600 + i as u64, 0.5);
            let w = quantized(qt, &wf, inp);
            let p = x16::Panels16::new(qt, &w, out, inp).expect("a panel type and shape");
            let mut acts = QuantActs::default();
            let mut want = vec![0f32; t * out];
            gemm::matmul_quant_gemm(&x, &w, qt, inp, out, &mut want, &mut acts);
            let mut got = vec![f32::NAN; t * out];
            gemm::matmul_panels_gemm(&x, &p, &mut got, &mut acts);
            assert_eq!(got, want, "{qt:?} T={t} {inp}x{out}");
        }
    }
}
