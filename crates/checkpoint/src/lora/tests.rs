use super::*;
use contract::presets::Preset;

fn tiny() -> LlamaConfig {
    Preset::Tiny.config().unwrap()
}

fn spec(rank: usize, targets: &[LoraTarget]) -> PeftSpec {
    PeftSpec {
        rank,
        alpha: 2.0 * rank as f32,
        targets: targets.to_vec(),
        rslora: false,
        seed: 7,
        amp: 0.05,
    }
}

#[test]
fn written_adapters_read_back_exactly_for_several_ranks_and_targets() {
    let c = tiny();
    let dir = tempfile::tempdir().unwrap();
    for (k, (r, targets)) in [
        (1, vec![LoraTarget::Q, LoraTarget::V]),
        (4, LoraTarget::ALL.to_vec()),
        (8, vec![LoraTarget::O, LoraTarget::Down]),
    ]
    .into_iter()
    .enumerate()
    {
        let d = dir.path().join(format!("a{k}"));
        let mut s = spec(r, &targets);
        s.rslora = k == 1;
        let written = write_peft_adapter(&d, &c, &s).unwrap();
        let read = load_adapter(&d, &c, 16).unwrap();
        assert_eq!(read, written);
        assert_eq!(read.targets(), targets);
        let want = if s.rslora {
            2.0 * r as f32 / (r as f32).sqrt()
        } else {
            2.0
        };
        assert_eq!(read.scale, want);
        // PEFT's names and the F32 dtype, byte for byte in the header
        let bytes = std::fs::read(d.join(ADAPTER_WEIGHTS)).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let name = format!(
            "{PREFIX}0.{}.{}.lora_A.weight",
            targets[0].block(),
            targets[0].name()
        );
        let view = st.tensor(&name).unwrap();
        assert_eq!(view.dtype(), Dtype::F32);
        assert_eq!(view.shape(), &[r, targets[0].dims(&c).0]);
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join(ADAPTER_CONFIG)).unwrap())
                .unwrap();
        assert_eq!(cfg["r"], r);
        assert_eq!(cfg["peft_type"], "LORA");
    }
}

/// Rewrites one tensor of the adapter in `d` with `f` applied to its values
/// and shape.
fn rewrite(d: &Path, f: impl Fn(&str, &mut Vec<usize>, &mut Vec<f32>)) {
    let path = d.join(ADAPTER_WEIGHTS);
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let mut shape = v.shape().to_vec();
            let mut data = to_f32(v.dtype(), v.data()).unwrap();
            f(&n, &mut shape, &mut data);
            (n, shape, data)
        })
        .collect();
    owned.sort_by(|a, b| a.0.cmp(&b.0));
    let views: Vec<_> = owned
        .iter()
        .map(|(n, s, v)| {
            let view = safetensors::tensor::TensorView::new(
                Dtype::F32,
                s.clone(),
                bytemuck::cast_slice(v),
            )
            .unwrap();
            (n.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
}

#[test]
fn bad_adapters_are_refused_naming_the_field_or_tensor() {
    let c = tiny();
    let dir = tempfile::tempdir().unwrap();
    let fresh = |name: &str| {
        let d = dir.path().join(name);
        write_peft_adapter(&d, &c, &spec(4, &[LoraTarget::Q, LoraTarget::Up])).unwrap();
        d
    };
    let err = |d: &Path, max: usize| load_adapter(d, &c, max).unwrap_err().to_string();

    let d = fresh("noconfig");
    std::fs::remove_file(d.join(ADAPTER_CONFIG)).unwrap();
    let e = err(&d, 16);
    assert!(e.contains(ADAPTER_CONFIG), "{e}");

    let d = fresh("rank");
    let e = err(&d, 2);
    assert!(e.contains("`r` is 4, above --max-lora-rank 2"), "{e}");

    let d = fresh("module");
    let cfg = std::fs::read_to_string(d.join(ADAPTER_CONFIG)).unwrap();
    std::fs::write(
        d.join(ADAPTER_CONFIG),
        cfg.replace("\"up_proj\"", "\"embed_tokens\""),
    )
    .unwrap();
    let e = err(&d, 16);
    assert!(e.contains("`target_modules` names `embed_tokens`"), "{e}");

    let d = fresh("untargeted");
    let cfg = std::fs::read_to_string(d.join(ADAPTER_CONFIG)).unwrap();
    std::fs::write(
        d.join(ADAPTER_CONFIG),
        cfg.replace("\"up_proj\"", "\"k_proj\""),
    )
    .unwrap();
    let e = err(&d, 16);
    assert!(
        e.contains("mlp.up_proj.lora_A.weight") && e.contains("not among"),
        "{e}"
    );

    let d = fresh("shape");
    rewrite(&d, |n, s, v| {
        if n.ends_with("layers.1.self_attn.q_proj.lora_B.weight") {
            s[0] -= 1;
            v.truncate(s[0] * s[1]);
        }
    });
    let e = err(&d, 16);
    assert!(
        e.contains("layers.1.self_attn.q_proj.lora_B.weight") && e.contains("shape"),
        "{e}"
    );

    let d = fresh("nan");
    rewrite(&d, |n, _, v| {
        if n.ends_with("layers.0.mlp.up_proj.lora_A.weight") {
            v[5] = f32::NAN;
        }
    });
    let e = err(&d, 16);
    assert!(
        e.contains("layers.0.mlp.up_proj.lora_A.weight") && e.contains("non-finite"),
        "{e}"
    );

    let d = fresh("half");
    rewrite(&d, |_, _, _| {});
    let path = d.join(ADAPTER_WEIGHTS);
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<_> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| !n.ends_with("layers.2.mlp.up_proj.lora_B.weight"))
        .collect();
    safetensors::serialize_to_file(kept, None, &path).unwrap();
    let e = err(&d, 16);
    assert!(
        e.contains("layers.2.mlp.up_proj.lora_B.weight") && e.contains("missing"),
        "{e}"
    );

    let e = resolve_adapter("./no/such/adapter")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no/such/adapter"), "{e}");
}
