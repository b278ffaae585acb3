use super::*;
use contract::presets::Preset;
use safetensors::SafeTensors;
use std::sync::Arc;

fn tiny() -> ModelConfig {
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
    assert!(e.contains("`target_modules[1]` is not a projection"), "{e}");
    assert!(!e.contains("embed_tokens"), "{e}");

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

/// A fresh rank-4 adapter on q_proj and up_proj in `root/name`.
fn fresh(root: &Path, name: &str) -> PathBuf {
    let d = root.join(name);
    write_peft_adapter(&d, &tiny(), &spec(4, &[LoraTarget::Q, LoraTarget::Up])).unwrap();
    d
}

/// Writes a safetensors file whose header is exactly `header` (JSON text).
fn raw_safetensors(path: &Path, header: &str, data: &[u8]) {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// `f` run on another thread, given `secs` to finish: a hang fails the
/// test instead of stalling it.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .expect("the load did not finish in time")
}

#[test]
fn config_errors_name_the_field_without_echoing_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    for (field, value) in [
        ("bias", "\"SECRET-TOKEN-123\""),
        ("lora_alpha", "\"SECRET-TOKEN-123\""),
        ("target_modules", "[\"SECRET-TOKEN-123\"]"),
        ("target_modules", "\"SECRET-TOKEN-123\""),
        ("rank_pattern", "{\"SECRET-TOKEN-123\": 2}"),
        ("use_dora", "true"),
    ] {
        let d = fresh(dir.path(), field);
        let p = d.join(ADAPTER_CONFIG);
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        cfg[field] = serde_json::from_str(value).unwrap();
        std::fs::write(&p, cfg.to_string()).unwrap();
        let e = load_adapter(&d, &c, 16).unwrap_err().to_string();
        assert!(e.contains(&format!("`{field}")), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
    }
}

#[cfg(unix)]
#[test]
fn unreachable_adapters_get_one_public_message_and_never_hang() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    // a FIFO config with no writer: a blocking read would never return
    let fifo = fresh(&root, "fifo");
    std::fs::remove_file(fifo.join(ADAPTER_CONFIG)).unwrap();
    let c = std::ffi::CString::new(fifo.join(ADAPTER_CONFIG).to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // weights that are an endless device
    let zero = fresh(&root, "zero");
    std::fs::remove_file(zero.join(ADAPTER_WEIGHTS)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero.join(ADAPTER_WEIGHTS)).unwrap();
    let noconfig = fresh(&root, "noconfig");
    std::fs::remove_file(noconfig.join(ADAPTER_CONFIG)).unwrap();
    let plain = root.join("plain-file");
    std::fs::write(&plain, "x").unwrap();
    let cases = [
        fifo,
        zero,
        noconfig,
        root.join("absent"),
        plain,
        PathBuf::from("/proc/self"),
    ];
    let messages = within(20, move || {
        cases
            .iter()
            .map(|d| {
                let spec = d.to_str().unwrap().to_string();
                let e = resolve_adapter(&spec)
                    .and_then(|d| load_adapter(&d, &tiny(), 16))
                    .unwrap_err();
                (e.to_string(), e.public(&spec).replace(&spec, "SPEC"))
            })
            .collect::<Vec<_>>()
    });
    assert!(messages[0].0.contains("FIFO"), "{messages:?}");
    assert!(messages[1].0.contains("device"), "{messages:?}");
    for (_, public) in &messages {
        assert_eq!(public, &messages[0].1, "{messages:?}");
    }
}

#[test]
fn oversized_weights_are_refused_before_reading_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = fresh(dir.path(), "sparse");
    // a sparse file: nothing on disk, 512 MiB to whoever reads it
    let f = std::fs::File::create(d.join(ADAPTER_WEIGHTS)).unwrap();
    f.set_len(512 << 20).unwrap();
    drop(f);
    let e = within(20, move || load_adapter(&d, &tiny(), 16).unwrap_err());
    assert!(
        matches!(e, LoraLoadError::File(FileError::TooLarge { .. })),
        "{e}"
    );
    assert!(e.to_string().contains(ADAPTER_WEIGHTS), "{e}");
}

#[test]
fn declared_tensors_past_the_memory_limit_are_refused_before_converting() {
    let dir = tempfile::tempdir().unwrap();
    let d = fresh(dir.path(), "big");
    let limits = LoadLimits {
        max_memory: 1024,
        ..LoadLimits::rank(16)
    };
    let e = load_adapter_within(&d, &tiny(), &limits).unwrap_err();
    assert!(
        e.to_string().contains("--max-lora-memory-mib") && e.to_string().contains("1024"),
        "{e}"
    );
}

#[test]
fn a_tensor_named_twice_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let d = dir.path().join("dup");
    write_peft_adapter(&d, &c, &spec(1, &[LoraTarget::Q])).unwrap();
    // keep layer 0 only: the rest is rewritten by hand below
    let c1 = ModelConfig {
        num_layers: 1,
        ..c.clone()
    };
    let (i, o) = LoraTarget::Q.dims(&c1);
    let a = format!("{PREFIX}0.self_attn.q_proj.lora_A.weight");
    let b = format!("{PREFIX}0.self_attn.q_proj.lora_B.weight");
    let (na, nb) = (i * 4, o * 4);
    // both entries of `a` point at the same bytes, so the file is valid
    // safetensors once the JSON map keeps one of them
    let header = format!(
        "{{\"{a}\":{{\"dtype\":\"F32\",\"shape\":[1,{i}],\"data_offsets\":[0,{na}]}},\
         \"{a}\":{{\"dtype\":\"F32\",\"shape\":[1,{i}],\"data_offsets\":[0,{na}]}},\
         \"{b}\":{{\"dtype\":\"F32\",\"shape\":[{o},1],\"data_offsets\":[{na},{}]}}}}",
        na + nb
    );
    raw_safetensors(&d.join(ADAPTER_WEIGHTS), &header, &vec![0u8; na + nb]);
    let e = load_adapter(&d, &c1, 16).unwrap_err().to_string();
    assert!(e.contains(&a) && e.contains("twice"), "{e}");
}

#[test]
fn a_layer_written_with_a_leading_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let d = fresh(dir.path(), "zeros");
    let path = d.join(ADAPTER_WEIGHTS);
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut views = st.tensors();
    let (name, view) = views
        .iter()
        .find(|(n, _)| n.contains("layers.1.self_attn.q_proj.lora_A"))
        .cloned()
        .unwrap();
    let twin = name.replace("layers.1.", "layers.01.");
    views.push((twin.clone(), view));
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let e = load_adapter(&d, &c, 16).unwrap_err().to_string();
    assert!(e.contains(&twin) && e.contains("plain decimal"), "{e}");
}

#[test]
fn identical_files_share_one_adapter_until_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let a = fresh(dir.path(), "a");
    let b = fresh(dir.path(), "b");
    let other = dir.path().join("other");
    let mut s = spec(4, &[LoraTarget::Q, LoraTarget::Up]);
    s.seed = 99;
    write_peft_adapter(&other, &c, &s).unwrap();
    let cache = AdapterCache::default();
    let limits = LoadLimits::rank(16);
    let x = cache.load(&a, &c, &limits).unwrap();
    let y = cache.load(&b, &c, &limits).unwrap();
    let z = cache.load(&other, &c, &limits).unwrap();
    assert!(Arc::ptr_eq(&x, &y), "identical files load once");
    assert!(!Arc::ptr_eq(&x, &z));
    assert_eq!(cache.live(), 2);
    let weak = Arc::downgrade(&x);
    drop((x, y, z));
    assert!(weak.upgrade().is_none(), "the cache keeps nothing alive");
    assert_eq!(cache.live(), 0);
}
