//! The stacked matrix against the fused one.

use super::*;

fn bf16_rows(rows: usize, cols: usize, seed: u64) -> Vec<bf16> {
    (0..rows * cols)
        .map(|i| {
            let u = checkpoint::synth::splitmix64(i as u64 ^ seed) >> 40;
            bf16::from_f32(u as f32 / (1u64 << 24) as f32 - 0.5)
        })
        .collect()
}

/// A stack of parts gives the fused matrix's bits (each output is its
/// weight row's product alone), for prompt, generated and mixed rows:
/// on this processor's layout with parts of whole 16-row panels, and
/// on the row-major layout with ragged parts.
#[test]
fn a_stack_of_parts_equals_the_fused_matrix() {
    let isa = Isa::best();
    let panels = isa == Isa::Avx512;
    let best = Layout {
        panels,
        split: panels && cpu_kernels::isa::split_products(),
    };
    let rows_major = Layout {
        panels: false,
        split: false,
    };
    for (layout, a, b) in [(best, 48, 16), (rows_major, 40, 24)] {
        stack_equals_fused(isa, layout, a, b);
    }
}

fn stack_equals_fused(isa: Isa, layout: Layout, a: usize, b: usize) {
    let (cols, t) = (64, 7);
    let (wa, wb) = (bf16_rows(a, cols, 1), bf16_rows(b, cols, 2));
    let fused_w: Vec<bf16> = wa.iter().chain(&wb).copied().collect();
    let x: Vec<f32> = (0..t * cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let pack = |w: &[bf16], qt: Option<QuantType>| {
        let rows = w.len() / cols;
        pack_group(
            vec![Part::Dense(w.to_vec())],
            &[rows],
            cols,
            "w",
            qt,
            layout,
        )
        .unwrap()
    };
    for qt in [None, Some(QuantType::Q4_1), Some(QuantType::Q8_0)] {
        let fused = pack(&fused_w, qt);
        let stack = Matrix::Stack(vec![(pack(&wa, qt), a), (pack(&wb, qt), b)]);
        let (prompt, generated) = ([0, 3, 4], [1, 2, 5, 6]);
        for rows in [
            Rows::Generated,
            Rows::Prompt,
            Rows::Mixed {
                prompt: &prompt,
                generated: &generated,
            },
        ] {
            let run = |m: &Matrix| {
                let mut y = vec![f32::NAN; t * (a + b)];
                m.matmul(isa, &x, cols, a + b, &mut y, rows, &mut MatBufs::default());
                y
            };
            assert_eq!(run(&stack), run(&fused), "{qt:?} {a}+{b}");
        }
    }
}
