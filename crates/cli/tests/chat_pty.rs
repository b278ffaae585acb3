//! `lamina chat` through a pseudo-terminal, as a person types it: a
//! multi-turn conversation with SmolLM2, a reply cut at `--max-tokens`,
//! Ctrl-C in the middle of a reply followed by a question whose prompt
//! still holds the earlier turns, `/help`, an unknown command, `"""`
//! multi-line input, `/save`, and Ctrl-D ending the session cleanly with
//! the history kept under `$LAMINA_HOME`; pasted text (bracketed, and
//! several lines in one write without the brackets) arriving whole, `/set`;
//! the spinner of `generate` while a long prompt is processed on a
//! terminal, and Ctrl-C during `generate` printing the timings.

mod support;

use rexpect::reader::Options;
use rexpect::session::{PtySession, spawn_with_options};
use std::process::Command;

/// The default model's directory in the default store (fetched on first use).
fn smollm2_dir() -> String {
    let out = support::lamina(&["pull", "smollm2-135m-instruct"]);
    let line = support::ok(&out);
    line.trim()
        .split('\t')
        .nth(1)
        .expect("id<TAB>path")
        .to_string()
}

/// The prompt sizes the `-v` timings reported so far.
fn prompt_sizes(text: &str) -> Vec<usize> {
    text.split("prompt ")
        .skip(1)
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// Waits for the next `>>> ` prompt; returns what came before it.
fn prompt(p: &mut PtySession) -> String {
    p.exp_string(">>> ").expect("the prompt comes back")
}

#[test]
fn chat_repl_through_a_terminal() {
    let home = tempfile::tempdir().unwrap();
    let model = smollm2_dir();
    let mut cmd = Command::new(support::bin());
    cmd.args([
        "-v",
        "chat",
        "--device",
        "cpu",
        "--model",
        &model,
        "--temperature",
        "0",
        "--max-tokens",
        "40",
    ]);
    cmd.env("LAMINA_HOME", home.path());
    let opts = Options::new()
        .timeout_ms(Some(180_000))
        .strip_ansi_escape_codes(true);
    let mut p = spawn_with_options(cmd, opts).expect("spawn lamina chat in a pty");
    let mut seen = prompt(&mut p);
    assert!(seen.contains("/help lists the commands"), "{seen}");

    p.send_line("/help").unwrap();
    let help = prompt(&mut p);
    for cmd in [
        "/clear",
        "/system TEXT",
        "/save FILE",
        "/load FILE",
        "/bye",
        "\"\"\"",
    ] {
        assert!(help.contains(cmd), "{cmd} missing from {help}");
    }
    // line editing: arrow keys move the cursor (`/hlp`, two left, `e`: `/help`)
    p.send("/hlp\x1b[D\x1b[De").unwrap();
    p.send_line("").unwrap();
    // (the editor redraws the line, prompt included, as it is edited)
    let edited = p.exp_string("/system TEXT").expect("/help ran");
    assert!(!edited.contains("^[[D"), "{edited}");
    prompt(&mut p);
    p.send_line("/frobnicate now").unwrap();
    let hint = prompt(&mut p);
    assert!(
        hint.contains("unknown command /frobnicate") && hint.contains("/help"),
        "{hint}"
    );

    // turn 1: a long story, cut at --max-tokens 40
    p.send_line("My name is Ada. Tell me a long story about a dragon.")
        .unwrap();
    let first = prompt(&mut p);
    assert!(first.contains("[reply cut at --max-tokens 40]"), "{first}");
    seen.push_str(&first);

    // turn 2: Ctrl-C in the middle of the reply
    p.send_line("Tell me another long story, about a knight.")
        .unwrap();
    p.exp_string("knight.").unwrap(); // the echo of the line
    p.exp_string("knight").expect("the reply starts"); // the reply
    p.send_control('c').unwrap();
    let cut = prompt(&mut p);
    assert!(cut.contains("[interrupted"), "{cut}");
    seen.push_str(&cut);

    // turn 3, multi-line: its prompt holds every earlier turn
    p.send_line("\"\"\"What is my name?").unwrap();
    p.exp_string("... ").unwrap();
    p.send_line("Answer in one word.\"\"\"").unwrap();
    let third = prompt(&mut p);
    seen.push_str(&third);
    let sizes = prompt_sizes(&seen);
    assert_eq!(sizes.len(), 3, "one timing line per reply: {seen}");
    assert!(
        sizes[1] > sizes[0] + 40 && sizes[2] > sizes[1],
        "prompts grow with the conversation: {sizes:?}"
    );

    let saved = home.path().join("conv.json");
    p.send_line(&format!("/save {}", saved.display())).unwrap();
    prompt(&mut p);
    let conv: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    let roles: Vec<&str> = conv.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant"
        ]
    );
    assert!(
        conv[0]["content"]
            .as_str()
            .unwrap()
            .contains("My name is Ada")
    );
    assert!(
        !conv[3]["content"].as_str().unwrap().is_empty(),
        "the partial reply is kept"
    );
    assert_eq!(conv[4]["content"], "What is my name?\nAnswer in one word.");

    // Ctrl-D: a clean newline, exit 0, history saved
    p.send_control('d').unwrap();
    p.exp_eof().expect("the session ends");
    let status = format!("{:?}", p.process().wait().unwrap());
    assert!(
        status.contains("Exited(") && status.ends_with(", 0)"),
        "{status}"
    );
    let history = std::fs::read_to_string(home.path().join("chat_history")).unwrap();
    assert!(
        history.contains("My name is Ada") && history.contains("/help"),
        "{history}"
    );
}

/// A long prompt on the CPU shows a spinner with the prompt tokens done.
#[test]
fn long_prompts_show_progress_on_a_terminal() {
    let model = smollm2_dir();
    let ids: Vec<String> = (0..1500).map(|i| (1000 + i % 500).to_string()).collect();
    let ids = ids.join(",");
    let mut cmd = Command::new(support::bin());
    cmd.args([
        "generate",
        "--device",
        "cpu",
        "--model",
        &model,
        "--max-tokens",
        "1",
        "--prompt-tokens",
        &ids,
    ]);
    let opts = Options::new()
        .timeout_ms(Some(180_000))
        .strip_ansi_escape_codes(true);
    let mut p = spawn_with_options(cmd, opts).expect("spawn lamina generate in a pty");
    p.exp_string("processing the prompt: ").expect("a spinner");
    p.exp_string("/1500 tokens").expect("with the tokens done");
    p.exp_string("generated 1 tokens")
        .expect("then the timings");
    p.exp_eof().unwrap();
}

/// What a person pastes arrives whole: a bracketed paste of three lines
/// is one message; a `"""` block and two plain lines written in one burst
/// without the brackets (a terminal that does not bracket) lose no line.
/// `/set` changes a sampling setting, refuses a bad value with its range,
/// and sets the system message.
#[test]
fn pasted_text_and_set_through_a_terminal() {
    let home = tempfile::tempdir().unwrap();
    let model = smollm2_dir();
    let mut cmd = Command::new(support::bin());
    cmd.args([
        "run",
        &model,
        "--device",
        "cpu",
        "--temperature",
        "0",
        "-n",
        "6",
    ]);
    cmd.env("LAMINA_HOME", home.path());
    let opts = Options::new()
        .timeout_ms(Some(180_000))
        .strip_ansi_escape_codes(true);
    let mut p = spawn_with_options(cmd, opts).expect("spawn lamina run in a pty");
    prompt(&mut p);

    p.send_line("/set temperature -1").unwrap();
    let bad = prompt(&mut p);
    assert!(bad.contains("must be in [0,"), "{bad}");
    p.send_line("/set parameter top_k 5").unwrap();
    let set = prompt(&mut p);
    assert!(
        set.contains("top-k 5") && set.contains("temperature 0,"),
        "{set}"
    );
    p.send_line("/set system You are terse.").unwrap();
    assert!(prompt(&mut p).contains("system message set"));
    p.send_line("/set").unwrap();
    let shown = prompt(&mut p);
    assert!(
        shown.contains("You are terse.") && shown.contains("max tokens 6"),
        "{shown}"
    );

    // a bracketed paste, then Enter
    p.send("\x1b[200~Line one\nLine two\nLine three\x1b[201~")
        .unwrap();
    p.send_line("").unwrap();
    prompt(&mut p);
    // a """ block in one write, no brackets
    p.send("\"\"\"\nalpha\nbeta\n\"\"\"\n").unwrap();
    prompt(&mut p);
    // two plain lines in one write: two messages, neither dropped
    p.send("first line\nsecond line\n").unwrap();
    prompt(&mut p);
    prompt(&mut p);

    let saved = home.path().join("paste.json");
    p.send_line(&format!("/save {}", saved.display())).unwrap();
    prompt(&mut p);
    let conv: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    let said: Vec<(&str, &str)> = conv
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .filter(|(r, _)| *r != "assistant")
        .collect();
    assert_eq!(
        said,
        [
            ("system", "You are terse."),
            ("user", "Line one\nLine two\nLine three"),
            ("user", "alpha\nbeta"),
            ("user", "first line"),
            ("user", "second line"),
        ]
    );
    p.send_line("/bye").unwrap();
    p.exp_eof().expect("the session ends");
}

/// Ctrl-C while `generate` streams: the reply stops, the timings are
/// printed, exit status 130.
#[test]
fn ctrl_c_during_generate_prints_the_timings() {
    let model = smollm2_dir();
    let mut cmd = Command::new(support::bin());
    cmd.args([
        "generate",
        "--device",
        "cpu",
        "--ignore-eos",
        "-n",
        "4000",
        "--chat",
        &model,
        "Tell me a very long story.",
    ]);
    // no loading bars: the first text is the reply
    cmd.env("LAMINA_PROGRESS", "off");
    let opts = Options::new()
        .timeout_ms(Some(180_000))
        .strip_ansi_escape_codes(true);
    let mut p = spawn_with_options(cmd, opts).expect("spawn lamina generate in a pty");
    // some of the reply, then Ctrl-C
    p.exp_regex("[a-z]+ [a-z]+ [a-z]+ ")
        .expect("the reply streams");
    p.send_control('c').unwrap();
    p.exp_string("[interrupted]").expect("the cut is marked");
    let (_, timings) = p
        .exp_regex("generated [0-9]+ tokens")
        .expect("then the timings");
    assert!(!timings.contains("generated 4000"), "{timings}");
    p.exp_eof().unwrap();
    let status = format!("{:?}", p.process().wait().unwrap());
    assert!(status.ends_with(", 130)"), "{status}");
}
