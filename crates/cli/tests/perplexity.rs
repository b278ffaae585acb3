//! `lamina perplexity` computes llama-perplexity's figure: whole chunks of
//! `-c` tokens, BOS in front of each when the model adds one, only the
//! second half of each scored; and the text files the commands read are
//! regular files under a size limit, refused by name otherwise.
//!
//! The synthetic tiny model's tokenizer gives one token per byte (BOS in
//! front), so the tokens of a text and its chunks are known exactly.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{lamina, ok, stderr};

/// Tokens a chunk in these tests.
const C: usize = 16;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lamina-ppl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// ASCII text of `n` bytes (`n` tokens for the tiny model), varied.
fn ascii(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| b'a' + ((i * 7 + seed as usize) % 26) as u8)
        .collect()
}

/// `lamina perplexity --json` on `text` (written to `dir/name`).
fn ppl(dir: &Path, model: &Path, name: &str, text: &[u8], extra: &[&str]) -> Output {
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    let (m, f, c) = (
        model.to_str().unwrap(),
        file.to_str().unwrap(),
        C.to_string(),
    );
    let mut args = vec![
        "perplexity",
        "--device",
        "cpu",
        "--model",
        m,
        "--text",
        f,
        "-c",
        &c,
        "--json",
    ];
    args.extend_from_slice(extra);
    lamina(&args)
}

fn report(out: &Output) -> serde_json::Value {
    serde_json::from_str(ok(out).trim()).expect("one JSON object")
}

/// With BOS added: a text of `2c - 1` bytes is `2c` tokens, two chunks of
/// `c - 1 - c/2` scored tokens; one byte less is refused. The token a
/// chunk starts with is replaced by BOS (changing it changes nothing),
/// a token of its second half is scored (changing it changes the figure).
#[test]
fn whole_chunks_start_with_bos_and_only_their_second_halves_count() {
    let dir = scratch("bos");
    let model = support::synth_tiny(&dir, "tiny");
    let text = ascii(2 * C - 1, 0);
    let v = report(&ppl(&dir, &model, "a.txt", &text, &[]));
    assert_eq!(v["chunks"], 2, "{v}");
    assert_eq!(v["tokens_scored"], 2 * (C - 1 - C / 2), "{v}");
    assert_eq!(v["procedure"], "llama-perplexity", "{v}");
    let base = v["perplexity"].as_f64().unwrap();
    assert!(base.is_finite() && base > 1.0, "{v}");

    // byte c - 1 is token c: chunk 2's first, replaced by BOS
    let mut start = text.clone();
    start[C - 1] = b'!';
    let same = report(&ppl(&dir, &model, "b.txt", &start, &[]))["perplexity"].as_f64();
    assert_eq!(same, Some(base), "the chunk's first token must not count");
    // byte c + c/2 is token c + c/2 + 1, scored in chunk 2
    let mut scored = text.clone();
    scored[C + C / 2] = b'!';
    let moved = report(&ppl(&dir, &model, "c.txt", &scored, &[]))["perplexity"].as_f64();
    assert_ne!(moved, Some(base), "a second-half token must count");

    let short = ppl(&dir, &model, "d.txt", &text[1..], &[]);
    let err = stderr(&short);
    assert!(!short.status.success(), "{err}");
    assert!(
        err.contains("d.txt") && err.contains("at least 32"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tiny model with no BOS added (its tokenizer's post-processor and
/// `add_bos_token` removed).
fn without_bos(dir: &Path) -> PathBuf {
    let model = support::synth_tiny(dir, "nobos");
    let edit = |name: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let path = model.join(name);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&path, v.to_string()).unwrap();
    };
    edit("tokenizer.json", &|v| {
        v["post_processor"] = serde_json::Value::Null
    });
    edit("tokenizer_config.json", &|v| {
        v["add_bos_token"] = false.into()
    });
    model
}

/// The figure is exp of the mean negative log-likelihood of the second
/// halves only, the tail after the last whole chunk dropped: checked
/// against `--score-all` runs of each chunk and of its first half (their
/// difference is the second half's log-likelihood, the model being causal).
#[test]
fn the_figure_is_the_mean_nll_of_the_second_halves() {
    let dir = scratch("nll");
    let model = without_bos(&dir);
    let text = ascii(3 * C + 5, 3);
    let v = report(&ppl(&dir, &model, "all.txt", &text, &[]));
    let per_chunk = C - 1 - C / 2;
    assert_eq!(v["chunks"], 3, "{v}");
    assert_eq!(v["tokens_scored"], 3 * per_chunk, "{v}");

    let all_nll = |name: &str, part: &[u8]| {
        let r = report(&ppl(&dir, &model, name, part, &["--score-all"]));
        assert_eq!(r["tokens_scored"], part.len() - 1, "{r}");
        r["perplexity"].as_f64().unwrap().ln() * (part.len() - 1) as f64
    };
    let mut nll = 0.0;
    for (i, chunk) in text.chunks_exact(C).enumerate() {
        let head = &chunk[..C / 2 + 1];
        nll += all_nll(&format!("c{i}.txt"), chunk) - all_nll(&format!("h{i}.txt"), head);
    }
    let want = (nll / (3 * per_chunk) as f64).exp();
    let got = v["perplexity"].as_f64().unwrap();
    assert!((got / want - 1.0).abs() < 1e-4, "{got} vs {want}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// On a GGUF, BOS follows llama.cpp's decision read from the file (here its
/// `add_bos_token`): a store import whose tokenizer says otherwise (an
/// older import's default) changes nothing. A text of `2c - 1` bytes is
/// `2c` tokens only with BOS in front, two whole chunks.
#[test]
fn a_gguf_decides_bos_from_its_vocabulary() {
    let dir = scratch("gguf");
    let home = dir.join("home");
    let src = support::synth_tiny(&dir, "tiny");
    // GGUF carries no llama3 rope scaling
    let cfg_path = src.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["rope_scaling"] = serde_json::Value::Null;
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let gguf = dir.join("Tiny-Bos.gguf");
    support::gguf::write_gguf(&src, &gguf);
    let text = dir.join("t.txt");
    std::fs::write(&text, ascii(2 * C - 1, 1)).unwrap();
    let c = C.to_string();
    let args = [
        "perplexity",
        "--device",
        "cpu",
        "--model",
        gguf.to_str().unwrap(),
        "--text",
        text.to_str().unwrap(),
        "-c",
        &c,
        "--json",
    ];
    let first = report(&support::run(Some(&home), &args, None));
    assert_eq!(first["chunks"], 2, "{first}");

    let tc_path = home.join("models/tiny-bos/tokenizer_config.json");
    let mut tc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&tc_path).unwrap()).unwrap();
    assert_eq!(tc["add_bos_token"], true, "{tc}");
    tc["add_bos_token"] = false.into();
    std::fs::write(&tc_path, tc.to_string()).unwrap();
    let again = report(&support::run(Some(&home), &args, None));
    assert_eq!(again["perplexity"], first["perplexity"], "{again}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `cmd`'s output, or a failure when it runs past `limit` (then killed).
fn within(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("lamina runs");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A FIFO (no writer), a symlink to `/dev/zero`, a directory and a file
/// over 1 GiB (sparse) are refused at once naming the flag and the file,
/// for `perplexity --text` and `quantize --calibration`.
#[test]
fn text_files_must_be_regular_and_under_the_limit() {
    let dir = scratch("files");
    let model = support::synth_tiny(&dir, "tiny");
    let fifo = dir.join("fifo.txt");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let zero = dir.join("zero.txt");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let big = dir.join("big.txt");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len((1 << 30) + 1).unwrap();
    let cases = [
        (&fifo, "not a regular file"),
        (&zero, "not a regular file"),
        (&dir, "not a regular file"),
        (&big, "over the limit of 1073741824 bytes"),
    ];
    let m = model.to_str().unwrap();
    let out = dir.join("out");
    for (file, needle) in cases {
        let f = file.to_str().unwrap();
        for (flag, args) in [
            (
                "--text",
                vec!["perplexity", "--device", "cpu", "--model", m, "--text", f],
            ),
            (
                "--calibration",
                vec![
                    "quantize",
                    m,
                    "--out",
                    out.to_str().unwrap(),
                    "--calibration",
                    f,
                ],
            ),
        ] {
            // under 4 GiB of address space: an unbounded read fails here
            // instead of filling the machine
            let mut cmd = Command::new("sh");
            cmd.args([
                "-c",
                "ulimit -v 4194304 && exec \"$@\"",
                "sh",
                support::bin(),
            ])
            .args(&args);
            let r = within(cmd, Duration::from_secs(60));
            let err = stderr(&r);
            assert!(!r.status.success(), "{args:?} succeeded");
            assert!(!err.contains("panicked"), "{err}");
            assert!(err.contains(flag) && err.contains(f), "{args:?}: {err}");
            assert!(
                err.contains(needle),
                "{args:?}: `{err}` should say `{needle}`"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
