//! The output grammars run against a real vocabulary (SmolLM2's, from the
//! default model's GGUF): each family's call, as its own template writes
//! it, is accepted; arguments off the schema, unknown tools and prose where
//! a call is required are refused; reasoning runs free to its close marker;
//! `auto` leaves prose free.

mod closed;
#[path = "../common/mod.rs"]
mod common;
mod refs;
mod special;

use std::sync::{Arc, OnceLock};

use common::*;
use serde_json::json;
use spec_agent::{output_grammar, Reasoning, Tool, ToolChoice, ToolFormat};
use spec_core::Constraint;
use spec_grammar::{GrammarSpec, TokenEnv};
use spec_text::{tool_call, Message, Tokenizer};

fn tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = spec_hub::default_model().expect("default model");
            Arc::new(Tokenizer::from_gguf(&path).expect("GGUF tokenizer"))
        })
        .clone()
}

fn env() -> &'static TokenEnv {
    static ENV: OnceLock<TokenEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        let tokenizer = tokenizer();
        let vocab = tokenizer.vocab_size();
        TokenEnv::new(tokenizer, vocab).expect("token env")
    })
}

/// How the grammar takes `text`: whether every token is allowed, and
/// whether the output may end right after it.
fn run(spec: &GrammarSpec, text: &str) -> (bool, bool) {
    let tokens = tokenizer().encode(text, false).expect("encode");
    let mut constraint = env()
        .constraint(spec)
        .unwrap_or_else(|e| panic!("{e}\n{spec:?}"));
    if constraint.validate(&tokens).expect("validate") < tokens.len() {
        return (false, false);
    }
    let masks = constraint.masks(&tokens).expect("masks");
    (true, masks.last().is_some_and(|m| m.end_allowed))
}

fn special(text: &str) -> Option<u32> {
    tokenizer().special_token_id(text)
}

fn grammar(
    reasoning: Option<(&Reasoning, bool)>,
    format: ToolFormat,
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
) -> GrammarSpec {
    output_grammar(
        reasoning,
        Some(format),
        tools,
        choice,
        parallel,
        None,
        &special,
    )
    .expect("grammar")
    .expect("a constraint")
}

fn add() -> Tool {
    Tool {
        name: "add".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
    }
}

/// The call the family's template writes, and the same call with `days`
/// off its schema (a string, or text that is no integer).
fn calls(family: &Family) -> (String, String) {
    let text = assistant_text(family, &conversation()[..3]);
    let call = match Reasoning::detect(&source(family.file)) {
        Some(r) if text.contains(r.close()) => text
            .rsplit(r.close())
            .next()
            .unwrap_or(&text)
            .trim_start()
            .to_owned(),
        _ => text,
    };
    let bad_days = match family.format {
        ToolFormat::Hermes | ToolFormat::Llama3Json | ToolFormat::Mistral => "\"3\"",
        _ => "three",
    };
    assert_eq!(call.matches('3').count(), 1, "{call}");
    let bad = call.replace('3', bad_days);
    (call, bad)
}
#[test]
fn required_calls_follow_the_format_and_the_schema() {
    let tools = [weather(), add()];
    for family in &FAMILIES {
        let (call, bad) = calls(family);
        let spec = grammar(None, family.format, &tools, &ToolChoice::Required, false);
        assert_eq!(
            run(&spec, &call),
            (true, true),
            "{}: {call:?}\n{spec:?}",
            family.file
        );
        assert!(
            !run(&spec, &bad).0,
            "{}: {bad:?} off the schema",
            family.file
        );
        assert!(
            !run(&spec, "The weather is fine.").0,
            "{}: prose is no call",
            family.file
        );
        let unknown = call.replace("get_weather", "get_forecast");
        assert!(
            !run(&spec, &unknown).0,
            "{}: unknown tool {unknown:?}",
            family.file
        );
        // A named choice takes that tool only.
        let named = grammar(
            None,
            family.format,
            &tools,
            &ToolChoice::Named("add".into()),
            false,
        );
        assert!(!run(&named, &call).0, "{}: not the named tool", family.file);
        let named = grammar(
            None,
            family.format,
            &tools,
            &ToolChoice::Named("get_weather".into()),
            true,
        );
        assert!(run(&named, &call).0, "{}: the named tool", family.file);
    }
}

#[test]
fn auto_leaves_prose_free_but_calls_well_formed() {
    let tools = [weather()];
    for family in &FAMILIES {
        let (call, bad) = calls(family);
        let spec = grammar(None, family.format, &tools, &ToolChoice::Auto, true);
        // Harmony's answers are messages: the final channel's.
        let answer = |text: &str| match family.format {
            ToolFormat::Harmony => format!("<|channel|>final<|message|>{text}"),
            _ => text.to_owned(),
        };
        let prose = answer("It is probably sunny; I can check with a tool if you like.");
        assert_eq!(
            run(&spec, &prose),
            (true, true),
            "{}: prose\n{spec:?}",
            family.file
        );
        assert_eq!(
            run(&spec, &answer("")),
            (true, true),
            "{}: an empty answer",
            family.file
        );
        assert_eq!(run(&spec, &call), (true, true), "{}: {call:?}", family.file);
        assert!(
            !run(&spec, &bad).0,
            "{}: {bad:?} off the schema",
            family.file
        );
        let unknown = call.replace("get_weather", "get_forecast");
        assert!(
            !run(&spec, &unknown).0,
            "{}: unknown tool {unknown:?}",
            family.file
        );
        if family.format != ToolFormat::Llama3Json {
            let with_prose = match family.format {
                ToolFormat::Harmony => format!(
                    "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant{call}"
                ),
                _ => format!("Let me check. {call}"),
            };
            assert_eq!(
                run(&spec, &with_prose),
                (true, true),
                "{}: {with_prose:?}",
                family.file
            );
        }
    }
}

#[test]
fn reasoning_runs_free_until_it_closes() {
    let tools = [weather()];
    for family in FAMILIES.iter().filter(|f| f.reasoning == Some("<think>")) {
        let think = Reasoning::detect(&source(family.file)).expect("think");
        let (call, _) = calls(family);
        let thought = "Hmm: {\"not\": json} <tool_call> is just text here.\n";
        let spec = grammar(
            Some((&think, true)),
            family.format,
            &tools,
            &ToolChoice::Required,
            false,
        );
        let text = format!("{thought}</think>\n\n{call}");
        assert_eq!(
            run(&spec, &text),
            (true, true),
            "{}: {text:?}\n{spec:?}",
            family.file
        );
        let prose = format!("{thought}</think>\n\nIt is sunny.");
        assert!(
            !run(&spec, &prose).0,
            "{}: the body applies after the reasoning",
            family.file
        );
        assert!(run(&spec, thought).0, "{}: still thinking", family.file);
        let spec = grammar(
            Some((&think, false)),
            family.format,
            &tools,
            &ToolChoice::Required,
            false,
        );
        assert_eq!(
            run(&spec, &format!("<think>{text}")),
            (true, true),
            "{}",
            family.file
        );
        assert_eq!(
            run(&spec, &call),
            (true, true),
            "{}: the model may skip it",
            family.file
        );
    }
}

#[test]
fn a_response_format_applies_after_the_reasoning() {
    let think = Reasoning::detect("<think></think>").expect("think");
    let schema = GrammarSpec::JsonSchema(
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    );
    let spec = output_grammar(
        Some((&think, true)),
        None,
        &[],
        &ToolChoice::Auto,
        true,
        Some(&schema),
        &special,
    )
    .expect("grammar")
    .expect("a constraint");
    assert_eq!(run(&spec, "Two and two.</think>\n{\"n\": 4}"), (true, true));
    assert!(!run(&spec, "Two and two.</think>\n{\"n\": \"4\"}").0);
    // With tools under auto: the format or a call.
    let spec = output_grammar(
        None,
        Some(ToolFormat::Hermes),
        &[weather()],
        &ToolChoice::Auto,
        false,
        Some(&schema),
        &special,
    )
    .expect("grammar")
    .expect("a constraint");
    assert_eq!(run(&spec, "{\"n\": 4}"), (true, true));
    let (call, _) = calls(&FAMILIES[0]);
    assert_eq!(run(&spec, &call), (true, true));
    assert!(!run(&spec, "Four.").0);
}

#[test]
fn parallel_calls_only_when_allowed() {
    let tools = [weather(), add()];
    let two = Message::assistant_calls(
        "",
        vec![
            tool_call(CALL_ID, "get_weather", arguments()),
            tool_call("call00002", "add", json!({"a": 1, "b": 2.5})),
        ],
    );
    // Llama 3.2's template refuses several calls in one turn; gpt-oss
    // makes one call per response (`harmony_responses_are_messages`).
    for family in FAMILIES
        .iter()
        .filter(|f| !matches!(f.format, ToolFormat::Llama3Json | ToolFormat::Harmony))
    {
        let mut messages = conversation()[..2].to_vec();
        messages.push(two.clone());
        let text = assistant_text(family, &messages);
        let calls = match Reasoning::detect(&source(family.file)) {
            Some(r) if text.contains(r.close()) => text
                .rsplit(r.close())
                .next()
                .unwrap_or(&text)
                .trim_start()
                .to_owned(),
            _ => text,
        };
        let parallel = grammar(None, family.format, &tools, &ToolChoice::Required, true);
        assert_eq!(
            run(&parallel, &calls),
            (true, true),
            "{}: {calls:?}\n{parallel:?}",
            family.file
        );
        let single = grammar(None, family.format, &tools, &ToolChoice::Required, false);
        assert!(!run(&single, &calls).0, "{}: one call only", family.file);
    }
}

/// gpt-oss: analysis messages run free before the message asked for; a
/// required call is one call, even with `parallel_tool_calls`; a
/// `response_format` shapes the final channel's message.
#[test]
fn harmony_responses_are_messages() {
    let family = FAMILIES
        .iter()
        .find(|f| f.format == ToolFormat::Harmony)
        .expect("gpt-oss");
    let tools = [weather(), add()];
    let (call, _) = calls(family);
    let thought = "<|channel|>analysis<|message|>Hmm: {\"not\": json} to=functions.x<|end|><|start|>assistant";
    let spec = grammar(None, family.format, &tools, &ToolChoice::Required, true);
    assert_eq!(
        run(&spec, &format!("{thought}{call}")),
        (true, true),
        "{spec:?}"
    );
    assert_eq!(run(&spec, thought), (true, false), "still thinking");
    assert!(!run(&spec, "<|channel|>final<|message|>Sunny.").0);
    let add_call = " to=functions.add<|channel|>commentary json<|message|>{\"a\": 1, \"b\": 2}";
    assert_eq!(run(&spec, add_call), (true, true));
    assert!(
        !run(
            &spec,
            &format!("{call}<|call|><|start|>assistant{add_call}")
        )
        .0,
        "one call per response"
    );
    let harmony = Reasoning::detect(&source(family.file)).expect("analysis markers");
    let schema = GrammarSpec::JsonSchema(
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    );
    // No tools: the format is not passed, the reasoning markers say harmony.
    let spec = output_grammar(
        Some((&harmony, false)),
        None,
        &[],
        &ToolChoice::Auto,
        false,
        Some(&schema),
        &special,
    )
    .expect("grammar")
    .expect("a constraint");
    let final_ = "<|channel|>final<|message|>";
    assert_eq!(
        run(&spec, &format!("{thought}{final_}{{\"n\": 4}}")),
        (true, true)
    );
    assert!(!run(&spec, &format!("{final_}{{\"n\": \"4\"}}")).0);
    assert!(!run(&spec, "{\"n\": 4}").0, "outside a message");
}
