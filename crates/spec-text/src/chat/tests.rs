//! The template engine renders as transformers does.

use super::*;

fn render(source: &str, messages: &[Message]) -> Result<String, TextError> {
    ChatTemplate::new(source, Some("<s>"), None)?.render(messages, true)
}

fn check(source: &str, messages: &[Message], expected: &str) {
    assert_eq!(
        render(source, messages).expect("render"),
        expected,
        "{source}"
    );
}

#[test]
fn continuing_cuts_where_the_final_message_ends() {
    let source =
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}\
                  {% if add_generation_prompt %}<assistant>{% endif %}";
    let t = ChatTemplate::new(source, None, None).expect("compile");
    let messages = [Message::system("s"), Message::user("tell me")];
    assert_eq!(
        t.render_continuing(&messages).expect("render"),
        "<system>s</system>\n<user>tell me"
    );
    let trimming = ChatTemplate::new(
        "{% for m in messages %}[{{ m.content | trim }}]{% endfor %}",
        None,
        None,
    )
    .expect("compile");
    assert_eq!(
        trimming
            .render_continuing(&[Message::user("a b ")])
            .expect("render"),
        "[a b"
    );
    let dropping = ChatTemplate::new("{{ messages | length }}", None, None).expect("compile");
    assert!(matches!(
        dropping.render_continuing(&[Message::user("x")]),
        Err(TextError::ContinueFinalMessage { .. })
    ));
}

#[test]
fn variables_hf_templates_use() {
    let one = [Message::user("hi")];
    check(
        "{{ bos_token }}{{ messages[0]['role'] }}:{{ messages[0].content }}",
        &one,
        "<s>user:hi",
    );
    check("{% if add_generation_prompt %}go{% endif %}", &one, "go");
    // An absent special token is undefined, as in transformers, not "none".
    check(
        "[{{ eos_token }}]{% if eos_token is defined %}!{% endif %}",
        &one,
        "[]",
    );
}

#[test]
fn blocks_trim_like_transformers() {
    // trim_blocks drops the newline after a tag; lstrip_blocks the
    // indentation before one.
    let source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    check(
        source,
        &[
            Message::user("a"),
            Message::assistant("b"),
            Message::user("c"),
        ],
        "[a]\n[c]\n",
    );
}

#[test]
fn loop_controls() {
    let source = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}\
                  {% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}{% endfor %}";
    check(
        source,
        &[Message::system("s"), Message::user("u"), Message::user("x")],
        "u",
    );
}

#[test]
fn python_string_and_dict_methods() {
    let messages = [Message::user("  Hello world  ")];
    check(
        "{{ messages[0].content.strip() }}",
        &messages,
        "Hello world",
    );
    check(
        "{{ messages[0].content.strip().startswith('Hello') }}",
        &messages,
        "True",
    );
    check(
        "{{ messages[0].content.lstrip().endswith('world') }}",
        &messages,
        "False",
    );
    check(
        "{{ messages[0].content.split() | join('|') }}",
        &messages,
        "Hello|world",
    );
    check(
        "{{ messages[0].get('role') }}{{ messages[0].get('missing', 'd') }}",
        &messages,
        "userd",
    );
    check(
        "{% for k, v in messages[0].items() %}{{ k }}={{ v|length }};{% endfor %}",
        &messages,
        "role=4;content=15;",
    );
}

#[test]
fn tojson_matches_python_json_dumps() {
    let messages = [Message::user("héllo <b> & \"q\"")];
    check(
        "{{ messages|tojson }}",
        &messages,
        r#"[{"role": "user", "content": "héllo <b> & \"q\""}]"#,
    );
    check(
        "{{ messages[0]|tojson(indent=2) }}",
        &messages,
        "{\n  \"role\": \"user\",\n  \"content\": \"héllo <b> & \\\"q\\\"\"\n}",
    );
    check(
        "{{ messages[0].content|tojson(ensure_ascii=True) }}|{{ '😀'|tojson(ensure_ascii=False) }}",
        &messages,
        r#""h\u00e9llo <b> & \"q\""|"😀""#,
    );
    check(
        "{{ '😀'|tojson(ensure_ascii=True) }}",
        &messages,
        r#""\ud83d\ude00""#,
    );
    let err =
        render("{{ messages|tojson(sort_keys=true) }}", &messages).expect_err("unknown argument");
    assert!(matches!(err, TextError::TemplateRender { .. }), "{err}");
}

/// Nested loops that would take 10^15 steps end with a clear error,
/// in bounded time; a long but honest conversation still renders.
#[test]
fn a_runaway_template_runs_out_of_fuel() {
    let source = "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}{{ '' }}{% endfor %}{% endfor %}{% endfor %}";
    let err = render(source, &[Message::user("hi")]).expect_err("out of fuel");
    assert!(matches!(err, TextError::TemplateFuel { .. }), "{err}");
    assert!(err.to_string().contains("chat template"), "{err}");
    let many: Vec<Message> = (0..5_000).map(|i| Message::user(format!("m{i}"))).collect();
    let out = render(
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}",
        &many,
    )
    .expect("five thousand messages fit");
    assert!(out.ends_with("m4999\n"), "{}", &out[out.len() - 20..]);
}

#[test]
fn raise_exception_names_the_message() {
    let source = "{% if messages[0].role != 'system' %}{{ raise_exception('Conversation must start with a system message') }}{% endif %}";
    let err = render(source, &[Message::user("hi")]).expect_err("raised");
    assert!(matches!(err, TextError::TemplateRender { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("Conversation must start with a system message"),
        "{err}"
    );
}

#[test]
fn strftime_now_formats_local_time() {
    let year = chrono::Local::now().format("%Y").to_string();
    let rendered = render(
        "{{ strftime_now('%Y') }}|{{ strftime_now('%d %B %Y') }}",
        &[],
    )
    .expect("render");
    let (first, second) = rendered.split_once('|').expect("two parts");
    assert_eq!(first, year);
    assert!(second.ends_with(&year), "{second}");
    assert!(
        render("{{ strftime_now('%Q') }}", &[]).is_err(),
        "invalid format specifier"
    );
}

#[test]
fn syntax_errors_are_reported_at_compile_time() {
    let err = ChatTemplate::new("{% for m in messages %}", None, None).expect_err("unclosed");
    assert!(matches!(err, TextError::TemplateSyntax { .. }), "{err}");
}
