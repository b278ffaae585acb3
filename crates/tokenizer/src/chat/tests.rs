use super::*;

/// SmolLM2-135M-Instruct's template (GGUF `tokenizer.chat_template`).
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

fn tpl(src: &str) -> ChatTemplate {
    ok(ChatTemplate::new(
        src.to_string(),
        "<s>".to_string(),
        "</s>".to_string(),
        "test/tokenizer_config.json",
    ))
}

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

// Expected strings below were rendered by Python jinja2 3.1 with
// trim_blocks=True, lstrip_blocks=True (what transformers uses).
#[test]
fn smollm2_template_adds_default_system_prompt() {
    let t = tpl(SMOLLM2_TEMPLATE);
    let out = ok(t.render(&[msg("user", "What is 2+2?")], true));
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn smollm2_template_multi_turn_with_system() {
    let t = tpl(SMOLLM2_TEMPLATE);
    let conv = [
        msg("system", "Be brief."),
        msg("user", "Hi"),
        msg("assistant", "Hello!"),
        msg("user", "Bye"),
    ];
    let out = ok(t.render(&conv, false));
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    );
}

#[test]
fn llama3_fallback_format() {
    let t = ok(ChatTemplate::llama3_fallback("<|eot_id|>".into(), "l3"));
    let conv = [msg("system", "S"), msg("user", "U")];
    assert_eq!(
        ok(t.render(&conv, true)),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    assert_eq!(
        ok(t.render(&conv[1..], false)),
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
    );
}

#[test]
fn block_whitespace_and_python_methods_match_jinja2() {
    let src = "{% for m in messages %}\n  {% if m.role == 'user' %}\n    U: {{ m.content.strip() }}\n  {% else %}\n    A: {{ m.content }}\n  {% endif %}\n{% endfor %}\n";
    let out = ok(tpl(src).render(&[msg("user", "  hi  "), msg("assistant", "yo")], false));
    assert_eq!(out, "    U: hi\n    A: yo\n");
    let src =
        "{{ bos_token }}{% if messages[0]['content'].startswith('x') %}X{% endif %}{{ eos_token }}";
    assert_eq!(ok(tpl(src).render(&[msg("user", "xy")], false)), "<s>X</s>");
}

#[test]
fn raise_exception_fails_the_render_with_its_message() {
    let src = "{% if messages[0].role != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}ok";
    let t = tpl(src);
    let err = t
        .render(&[msg("user", "hi")], true)
        .err()
        .map(|e| e.to_string());
    let err = err.unwrap_or_default();
    assert!(err.contains("first message must be system"), "{err}");
    assert!(err.contains("test/tokenizer_config.json"), "{err}");
    assert_eq!(ok(t.render(&[msg("system", "s")], true)), "ok");
}

#[test]
fn syntax_errors_name_the_origin() {
    let r = ChatTemplate::new(
        "{% for %}".into(),
        String::new(),
        String::new(),
        "m/tokenizer_config.json",
    );
    let err = r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        err.contains("m/tokenizer_config.json") && err.contains("chat template"),
        "{err}"
    );
}

#[test]
fn strftime_directives() {
    let date = ok(time::Date::from_calendar_date(2024, time::Month::July, 5));
    let t = ok(date.with_hms(14, 3, 9)).assume_utc();
    assert_eq!(ok(strftime(&t, "%d %b %Y")), "05 Jul 2024");
    assert_eq!(
        ok(strftime(&t, "%A %B %e, %y %H:%M:%S %I%p %j %m %%")),
        "Friday July  5, 24 14:03:09 02PM 187 07 %"
    );
    assert!(strftime(&t, "%Q").is_err());
    // and from a template
    let out = ok(tpl("{{ strftime_now('%Y') }}").render(&[], false));
    assert!(out.len() == 4 && out.starts_with('2'), "{out}");
}

/// A template that loops (nested loops escape minijinja's range cap) is
/// refused at load when even one user message exhausts the budget, and is an
/// error for the one conversation that triggers it otherwise.
#[test]
fn looping_templates_exhaust_their_budget() {
    let nested =
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}hi";
    let e = ChatTemplate::new(nested.into(), String::new(), String::new(), "looping.json")
        .err()
        .expect("a template that loops on every conversation is refused");
    let msg = e.to_string();
    assert!(
        msg.contains("execution budget") && msg.contains("looping.json"),
        "{msg}"
    );

    let trap = "{% if messages[0].content == 'loop' %}{% for i in range(100000) %}\
                {% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}ok";
    let t = ChatTemplate::new(trap.into(), String::new(), String::new(), "trap.json").unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "fine")], true).unwrap(),
        "ok"
    );
    let e = t
        .render(&[ChatMessage::new("user", "loop")], true)
        .unwrap_err();
    assert!(e.to_string().contains("execution budget"), "{e}");
    // the budget holds per render: the template still renders afterwards
    assert_eq!(
        t.render(&[ChatMessage::new("user", "again")], true)
            .unwrap(),
        "ok"
    );
}

/// Tool calling: a template that reads `tools`, an assistant
/// turn's `tool_calls` (arguments as an object) and a `tool` turn's
/// `tool_call_id` gets them; without tools `tools` is undefined.
#[test]
fn tools_and_tool_calls_reach_the_template() {
    let t = tpl(
        "{% if tools is defined %}[{% for t in tools %}{{ t.function.name }};{% endfor %}]{% endif %}\
         {% for m in messages %}<{{ m.role }}>\
         {% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments.city }}){% endfor %}\
         {% else %}{{ m.content }}{% endif %}\
         {% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}{% endfor %}",
    );
    let tools = serde_json::json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {}}},
        {"type": "function", "function": {"name": "now"}}
    ]);
    let mut call = msg("assistant", "");
    call.tool_calls = Some(serde_json::json!([
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    ]));
    let mut result = msg("tool", "sunny");
    result.tool_call_id = Some("c1".into());
    let msgs = [msg("user", "Weather?"), call, result];
    assert_eq!(
        ok(t.render_with_tools(&msgs, Some(&tools), false)),
        "[get_weather;now;]<user>Weather?<assistant>get_weather(Oslo)<tool>sunny#c1"
    );
    assert_eq!(ok(t.render(&msgs[..1], false)), "<user>Weather?");
}

/// The render's error, which must name the byte budget (and come quickly,
/// before memory runs out).
fn budget_error(t: &ChatTemplate, msgs: &[ChatMessage]) -> String {
    let started = std::time::Instant::now();
    let e = match t.render(msgs, true) {
        Ok(text) => panic!("rendered {} bytes", text.len()),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("memory budget") && e.contains("bytes"), "{e}");
    assert!(started.elapsed().as_secs() < 10, "{e}");
    e
}

/// A template that doubles a string on every conversation is refused at
/// load, naming the byte budget; a shorter chain still renders.
#[test]
fn straight_line_doubling_is_refused_at_load() {
    let chain = |n: usize| {
        format!(
            "{{% set s = 'abcdefgh' %}}{}{{{{ s|length }}}}",
            "{% set s = s ~ s %}".repeat(n)
        )
    };
    assert_eq!(
        ok(tpl(&chain(10)).render(&[msg("user", "x")], true)),
        "8192"
    );
    for n in [24, 27, 30, 40] {
        let e = ChatTemplate::new(chain(n), String::new(), String::new(), "double.json")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("memory budget") && e.contains("double.json"),
            "{n}: {e}"
        );
    }
}

/// Growth that depends on the conversation (one doubling per message,
/// through `~`, `+` on lists, a macro writing its argument twice, raw
/// template text in nested loops) fails that render with the budget named;
/// the template keeps rendering other conversations.
#[test]
fn growth_per_message_exhausts_the_byte_budget() {
    let templates = [
        "{% set ns = namespace(s='ab') %}{% for m in messages %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(l=[1, 2]) %}{% for m in messages %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
        "{% macro d(s) %}{{ s }}{{ s }}{% endmacro %}{% set ns = namespace(s='ab') %}{% for m in messages %}{% set ns.s = d(ns.s) %}{% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(s='ab') %}{% for m in messages %}{% set ns.s = [ns.s, ns.s]|join %}{% endfor %}{{ ns.s|length }}",
        "{% for m in messages %}{% for i in range(100000) %}0123456789012345678901234567890123456789012345678901234567890123456789{% endfor %}{% endfor %}",
    ];
    for src in templates {
        let t = tpl(src);
        for n in [40, 64, 200] {
            let msgs = vec![msg("user", "x"); n];
            budget_error(&t, &msgs);
        }
        assert!(t.render(&[msg("user", "x")], true).is_ok(), "{src}");
    }
}

/// A count argument (a width, an indent) larger than the budget is refused
/// before anything is built.
#[test]
fn count_arguments_are_held_to_the_byte_budget() {
    for n in [1u64 << 30, 1 << 40, 5_000_000_000] {
        for src in [
            format!("{{% if messages|length > 1 %}}{{{{ 'a\nb'|indent({n}) }}}}{{% endif %}}"),
            format!(
                "{{% if messages|length > 1 %}}{{{{ messages|tojson(indent={n}) }}}}{{% endif %}}"
            ),
        ] {
            let t = tpl(&src);
            budget_error(&t, &[msg("user", "x"), msg("user", "y")]);
        }
    }
}

/// The budget grows with the input: a long conversation a template copies a
/// few times renders.
#[test]
fn byte_budget_scales_with_the_input() {
    let t = tpl("{% for m in messages %}{{ m.content }}{{ m.content }}{{ m.content }}{% endfor %}");
    let big = "x".repeat(30 << 20);
    assert_eq!(ok(t.render(&[msg("user", &big)], true)).len(), 90 << 20);
    assert!(render_byte_budget(0) >= TEMPLATE_MIN_BYTES);
    assert!(
        ChatTemplate::new(
            "{{ __lamina_charge_made(1) }}".into(),
            String::new(),
            String::new(),
            "r.json"
        )
        .is_err()
    );
}
