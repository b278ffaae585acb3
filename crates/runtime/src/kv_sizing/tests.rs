use super::*;

const G: usize = 1 << 30;

#[test]
fn the_pool_gets_what_the_utilization_leaves() {
    // an H200 (139 GiB usable), nothing else on it, a 2.5 GiB model
    let mem = GpuMemory {
        total: 139 * G,
        free_at_start: 139 * G - G / 2,
    };
    let needs = EngineNeeds {
        weights: 5 * G / 2,
        reserve: 2 * G,
    };
    let kv = gpu_kv_budget(mem, 0.9, 1, needs).unwrap();
    let allowed = (139.0 * 0.9 * G as f64) as usize;
    assert_eq!(kv, allowed - G / 2 - 5 * G / 2 - 2 * G);
    // a lower utilization leaves less, proportionally to the total
    let less = gpu_kv_budget(mem, 0.5, 1, needs).unwrap();
    assert!(kv - less > (139.0 * 0.39 * G as f64) as usize);
    // two engines on one device split what is left
    let two = gpu_kv_budget(mem, 0.9, 2, needs).unwrap();
    assert_eq!(two, (allowed - G / 2) / 2 - 5 * G / 2 - 2 * G);
}

#[test]
fn no_room_is_an_error_naming_the_flags() {
    let mem = GpuMemory {
        total: 16 * G,
        free_at_start: 4 * G,
    };
    let needs = EngineNeeds {
        weights: 2 * G,
        reserve: G,
    };
    let e = gpu_kv_budget(mem, 0.9, 1, needs).unwrap_err();
    assert!(
        e.contains("--gpu-memory-utilization") && e.contains("--kv-memory-gib"),
        "{e}"
    );
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let e = gpu_kv_budget(mem, bad, 1, needs).unwrap_err();
        assert!(e.contains("(0, 1]"), "{e}");
    }
}

#[test]
fn the_reserve_grows_with_the_step_and_the_batch() {
    // Llama-3.2-1B's shapes at the CUDA defaults: a few GiB at most
    let r = reserve_bytes(2048, 8192, 2048, 512, 128_256, 8192, 256);
    assert!(r > FIXED_RESERVE + G / 2 && r < 4 * G, "{r}");
    assert!(reserve_bytes(2048, 8192, 2048, 512, 128_256, 16384, 256) > r);
    assert!(reserve_bytes(2048, 8192, 2048, 512, 128_256, 8192, 512) > r);
}

#[test]
fn an_fp8_pool_holds_twice_the_tokens_of_bf16_in_the_same_memory() {
    use crate::options::KvOptions;
    use contract::KvCacheDtype;
    let cfg = contract::presets::Preset::Smollm2_135m.config().unwrap();
    let blocks = |dtype: KvCacheDtype| {
        let opts = RuntimeOptions {
            kv: KvOptions {
                memory_gib: Some(1.0),
                dtype,
                ..KvOptions::default()
            },
            ..RuntimeOptions::default()
        };
        let (per_block, n) = kv_pool(&opts, &cfg, None).unwrap();
        // 30 layers x K and V x 3 heads x 64 x 16 tokens of the element
        assert_eq!(per_block, 30 * 2 * 3 * 64 * 16 * dtype.bytes());
        n
    };
    let bf16 = blocks(KvCacheDtype::Bf16);
    let (fp8, f32) = (blocks(KvCacheDtype::Fp8), blocks(KvCacheDtype::F32));
    assert_eq!(blocks(KvCacheDtype::default()), bf16);
    // whole blocks of the budget: twice the blocks, less the odd one
    assert!(fp8 >= 2 * bf16 && fp8 / 2 == bf16, "fp8 {fp8}, bf16 {bf16}");
    assert!(bf16 >= 2 * f32 && bf16 / 2 == f32, "bf16 {bf16}, f32 {f32}");
}

/// A one-shot use's pool follows its request: prompt and reply
/// plus the slack, per sequence, at most the context; a conversation
/// gets one context; a block count still wins, and serving keeps the default.
#[test]
fn a_one_shot_pool_follows_the_request() {
    let shot = |tokens, sequences| OneShot { tokens, sequences };
    assert_eq!(
        one_shot_blocks(shot(Some(100), 1), 8192),
        (100 + 256usize).div_ceil(16)
    );
    assert_eq!(one_shot_blocks(shot(Some(100), 4), 8192), 4 * 23);
    assert_eq!(one_shot_blocks(shot(Some(1_000_000), 1), 8192), 512);
    assert_eq!(one_shot_blocks(shot(None, 1), 8192), 512);
    assert!(one_shot_blocks(shot(Some(5000), 1), 8192) > one_shot_blocks(shot(Some(50), 1), 8192));

    let cfg = contract::presets::Preset::Smollm2_135m.config().unwrap();
    let blocks = |kv_blocks: Option<usize>, one_shot: Option<OneShot>| {
        let mut opts = RuntimeOptions::default();
        (opts.kv.blocks, opts.kv.one_shot) = (kv_blocks, one_shot);
        kv_pool(&opts, &cfg, None).unwrap().1
    };
    // serving: the CPU default of 2 GiB (capped by the full contexts)
    let serve = blocks(None, None);
    let one = blocks(None, Some(shot(Some(300), 1)));
    assert_eq!(one, (300 + 256usize).div_ceil(16));
    assert!(serve > 20 * one, "serve {serve}, one-shot {one}");
    // an explicit size wins
    assert_eq!(blocks(Some(999), Some(shot(Some(300), 1))), 999);
}

#[test]
fn a_companion_keeps_as_many_blocks_as_the_target() {
    // 10 blocks of both fit; the target keeps its 10 blocks' bytes
    assert_eq!(split_pool(10 * (300 + 100) + 99, 300, 100), 10 * 300);
    assert_eq!(split_pool(1000, 300, 0), 900);
    assert_eq!(split_pool(0, 300, 100), 0);
}

#[test]
fn full_contexts_of_a_pool() {
    assert_eq!(full_contexts(65_536, 131_072), 0);
    assert_eq!(full_contexts(65_536, 8192), 8);
    assert_eq!(full_contexts(100, 0), 100);
}
