//! Real chat templates of each call-format family (`templates/`, sources in
//! its README): the format and reasoning markers they are detected by, a
//! conversation with tools, a call and its result rendered through
//! spec-text's `ChatTemplate`, and the call the template itself writes
//! parsed back, whole and streamed in odd-sized chunks.

mod common;

use common::*;
use serde_json::{json, Value};
use spec_agent::{OutputParser, Parsed, Reasoning, ToolFormat};
use spec_text::{ChatTemplate, Message, RenderOptions};

/// `text` parsed in one push and in odd-sized chunks; all must agree.
fn parse(family: &Family, text: &str) -> Parsed {
    let reasoning = Reasoning::detect(&source(family.file));
    let tools = [weather()];
    let run = |size: usize| {
        let mut parser = OutputParser::new(Some(family.format), reasoning.clone(), false, &tools);
        let mut pieces = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(size) {
            pieces.extend(parser.push(&chunk.iter().collect::<String>()));
        }
        pieces.extend(parser.finish());
        Parsed::of(&pieces)
    };
    let whole = run(text.chars().count().max(1));
    for size in [1, 2, 3, 4, 7, 13] {
        assert_eq!(
            run(size),
            whole,
            "{}: chunks of {size} of {text:?}",
            family.file
        );
    }
    whole
}

#[test]
fn each_family_is_detected() {
    for family in &FAMILIES {
        let source = source(family.file);
        assert_eq!(
            ToolFormat::detect(&source),
            Some(family.format),
            "{}",
            family.file
        );
        assert_eq!(
            Reasoning::detect(&source)
                .map(|r| r.open().to_owned())
                .as_deref(),
            family.reasoning,
            "{}",
            family.file
        );
    }
}

#[test]
fn tools_calls_and_results_render_through_each_template() {
    for family in &FAMILIES {
        let prompt = render(family, &conversation(), true);
        for needle in [
            "get_weather",
            "The weather in a city",
            "Sunny, 21 degrees",
            "What's the weather in Paris?",
        ] {
            assert!(
                prompt.contains(needle),
                "{}: {needle:?} missing in\n{prompt}",
                family.file
            );
        }
        let no_tools = template(family)
            .render(&conversation()[..2], true)
            .unwrap_or_else(|e| panic!("{}: {e}", family.file));
        assert!(
            !no_tools.contains("get_weather"),
            "{}: {no_tools}",
            family.file
        );
    }
}

#[test]
fn each_family_parses_the_call_its_template_writes() {
    for family in &FAMILIES {
        let messages = &conversation()[..3];
        let text = assistant_text(family, messages);
        assert!(text.contains("get_weather"), "{}: {text:?}", family.file);
        let parsed = parse(family, &text);
        assert_eq!(parsed.content, "", "{}: {text:?}", family.file);
        assert_eq!(parsed.calls.len(), 1, "{}: {text:?}", family.file);
        assert_eq!(parsed.calls[0].name, "get_weather", "{}", family.file);
        let args: Value = serde_json::from_str(&parsed.calls[0].arguments).expect("arguments JSON");
        assert_eq!(args, arguments(), "{}: {text:?}", family.file);
        // Text before the call stays content; a call cut short is content.
        // The call itself, past any (empty) reasoning block the template writes.
        let call = match Reasoning::detect(&source(family.file)) {
            Some(r) => text.rsplit(r.close()).next().unwrap_or(&text).trim_start(),
            None => text.trim_start(),
        };
        let with_prose = if family.format == ToolFormat::Harmony {
            // Harmony has no text outside messages: prose before a call is
            // a commentary message of its own.
            parse(
                family,
                &format!("<|channel|>commentary<|message|>Let me look that up. <|end|><|start|>assistant{call}"),
            )
        } else {
            parse(family, &format!("Let me look that up. {call}"))
        };
        if family.format == ToolFormat::Llama3Json {
            // Llama's bare JSON is a call only where the response begins.
            assert!(with_prose.calls.is_empty(), "{}", family.file);
        } else {
            assert_eq!(
                with_prose.content, "Let me look that up. ",
                "{}",
                family.file
            );
            assert_eq!(with_prose.calls, parsed.calls, "{}", family.file);
        }
        let cut = text.trim_end();
        let cut = &cut[..cut.len() - 3];
        let broken = parse(family, cut);
        assert!(broken.calls.is_empty(), "{}: {cut:?}", family.file);
        assert!(
            broken.content.contains("get_weather"),
            "{}: {broken:?}",
            family.file
        );
    }
}

#[test]
fn thinking_templates_split_their_own_reasoning() {
    for family in FAMILIES.iter().filter(|f| f.reasoning == Some("<think>")) {
        let mut messages = conversation();
        messages.push(
            Message::assistant("It is sunny in Paris.").with_reasoning("The tool said sunny."),
        );
        let text = assistant_text(family, &messages);
        let parsed = parse(family, &text);
        assert_eq!(
            parsed.reasoning.trim_end(),
            "The tool said sunny.",
            "{}: {text:?}",
            family.file
        );
        assert_eq!(
            parsed.content.trim_end(),
            "It is sunny in Paris.",
            "{}: {text:?}",
            family.file
        );
    }
}

#[test]
fn generation_prompts_say_whether_reasoning_is_open() {
    let kwargs = |on: bool| {
        json!({ "enable_thinking": on })
            .as_object()
            .cloned()
            .expect("object")
    };
    // gpt-oss always reasons (`reasoning_effort` says how much).
    for family in FAMILIES
        .iter()
        .filter(|f| f.reasoning.is_some() && f.format != ToolFormat::Harmony)
    {
        let reasoning = Reasoning::detect(&source(family.file)).expect("reasoning");
        let messages = &conversation()[..2];
        let off = kwargs(false);
        let prompt = template(family)
            .render_with(
                messages,
                &RenderOptions {
                    add_generation_prompt: true,
                    tools: None,
                    kwargs: Some(&off),
                },
            )
            .expect("render");
        assert!(
            reasoning.closed_by(&prompt),
            "{}: thinking off closes it: {prompt:?}",
            family.file
        );
        assert!(!reasoning.opened_by(&prompt), "{}", family.file);
        let on = kwargs(true);
        let prompt = template(family)
            .render_with(
                messages,
                &RenderOptions {
                    add_generation_prompt: true,
                    tools: None,
                    kwargs: Some(&on),
                },
            )
            .expect("render");
        assert!(
            !reasoning.closed_by(&prompt),
            "{}: thinking on leaves it to the model: {prompt:?}",
            family.file
        );
    }
}

#[test]
fn a_template_without_tools_falls_back() {
    let path = spec_hub::default_model().expect("default model");
    let tokenizer = spec_text::Tokenizer::from_gguf(&path).expect("tokenizer");
    let source = tokenizer
        .chat_template_source()
        .expect("SmolLM2 has a template");
    assert_eq!(ToolFormat::detect(source), None);
    assert_eq!(Reasoning::detect(source), None);
    // The fallback: Hermes syntax described in the system message.
    let system = spec_agent::fallback_tools_prompt(&[weather()]);
    let prompt = tokenizer
        .chat_template()
        .expect("template")
        .render(
            &[Message::system(system), Message::user("Weather in Paris?")],
            true,
        )
        .expect("render");
    assert!(
        prompt.contains("<tool_call>") && prompt.contains("\"get_weather\""),
        "{prompt}"
    );
    // What a server writes into the history is what the fallback parser reads.
    let call = spec_agent::fallback_call_text("get_weather", &arguments());
    assert!(
        call.contains(r#""city": "Paris, France", "days": 3"#),
        "{call}"
    );
    let mut parser = OutputParser::new(Some(ToolFormat::Hermes), None, false, &[weather()]);
    let mut pieces = parser.push(&call);
    pieces.extend(parser.finish());
    let parsed = Parsed::of(&pieces);
    assert_eq!(parsed.calls.len(), 1, "{call}");
    let args: Value = serde_json::from_str(&parsed.calls[0].arguments).expect("JSON");
    assert_eq!(args, arguments());
}

#[test]
fn several_calls_in_one_turn_parse_in_order() {
    let two = Message::assistant_calls(
        "",
        vec![
            spec_text::tool_call(CALL_ID, "get_weather", arguments()),
            spec_text::tool_call("call00002", "add", json!({"a": 1, "b": 2.5})),
        ],
    );
    // Llama 3.2's template refuses several calls in one turn; gpt-oss's
    // writes one call per response (`gpt_oss_turns_are_messages`).
    for family in FAMILIES
        .iter()
        .filter(|f| !matches!(f.format, ToolFormat::Llama3Json | ToolFormat::Harmony))
    {
        let mut messages = conversation()[..2].to_vec();
        messages.push(two.clone());
        let text = assistant_text(family, &messages);
        let parsed = parse(family, &text);
        let names: Vec<&str> = parsed.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "add"], "{}: {text:?}", family.file);
        let second: Value = serde_json::from_str(&parsed.calls[1].arguments).expect("JSON");
        assert_eq!(
            second,
            json!({"a": 1, "b": 2.5}),
            "{}: {text:?}",
            family.file
        );
        assert_eq!(parsed.content, "", "{}: {text:?}", family.file);
    }
}

/// Gemma 4 reads tool results from the calling turn (`tool_responses`) and
/// continues that turn: the `tool` turn of the API shape is folded in.
#[test]
fn gemma_results_render_inside_the_calling_turn() {
    let family = FAMILIES
        .iter()
        .find(|f| f.format == ToolFormat::Gemma4)
        .expect("gemma");
    let messages = spec_agent::template_messages(Some(family.format), &conversation());
    let prompt = render(family, &messages, true);
    let expected = "<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris, France<|\"|>,days:3,metric:true}<tool_call|>\
         <|tool_response>response:get_weather{value:<|\"|>Sunny, 21 degrees<|\"|>}<tool_response|>\
         <|channel>thought\n<channel|>";
    assert!(prompt.ends_with(expected), "{prompt:?}");
    // Unadapted, the result would be a turn of a role the model never saw.
    assert!(render(family, &conversation(), true).contains("<|turn>tool\n"));
}

/// DeepSeek-R1's distilled models: the generation prompt opens `<think>`,
/// so the output starts inside reasoning (and its call syntax is none of
/// ours: no format, the server falls back).
#[test]
fn a_prompt_that_opens_reasoning_starts_the_output_inside_it() {
    let source = source("deepseek-r1-distill-qwen.jinja");
    assert_eq!(ToolFormat::detect(&source), None);
    let reasoning = Reasoning::detect(&source).expect("<think>");
    let template =
        ChatTemplate::new(&source, Some("<｜begin▁of▁sentence｜>"), None).expect("compile");
    let prompt = template
        .render(&[Message::user("2+2?")], true)
        .expect("render");
    assert!(reasoning.opened_by(&prompt), "{prompt:?}");
    assert!(!reasoning.closed_by(&prompt));
    let mut parser = OutputParser::new(None, Some(reasoning), true, &[]);
    let mut pieces = Vec::new();
    for chunk in ["Two", " and two.\n</th", "ink>\n\nIt is ", "4."] {
        pieces.extend(parser.push(chunk));
    }
    pieces.extend(parser.finish());
    let parsed = Parsed::of(&pieces);
    assert_eq!(parsed.reasoning, "Two and two.\n");
    assert_eq!(parsed.content, "It is 4.");
}

/// gpt-oss's harmony messages: the reasoning and the answer its template
/// writes for a final turn parse back apart; two calls of one turn become
/// two call messages, each followed by its own result.
#[test]
fn gpt_oss_turns_are_messages() {
    let family = FAMILIES
        .iter()
        .find(|f| f.format == ToolFormat::Harmony)
        .expect("gpt-oss");
    let mut messages = conversation();
    messages
        .push(Message::assistant("It is sunny in Paris.").with_reasoning("The tool said sunny."));
    let messages = spec_agent::template_messages(Some(family.format), &messages);
    let text = render(family, &messages, false);
    let text = text
        .rsplit_once("<|start|>assistant<|channel|>analysis")
        .map(|(_, last)| format!("<|channel|>analysis{last}"))
        .expect("the last turn's analysis");
    assert!(text.ends_with("<|return|>"), "{text:?}");
    let parsed = parse(family, &text);
    assert_eq!(parsed.reasoning, "The tool said sunny.");
    assert_eq!(parsed.content, "It is sunny in Paris.");
    assert!(parsed.calls.is_empty());

    let two = vec![
        Message::user("Weather and a sum?"),
        Message::assistant_calls(
            "",
            vec![
                spec_text::tool_call(CALL_ID, "get_weather", arguments()),
                spec_text::tool_call("call00002", "add", json!({"a": 1, "b": 2})),
            ],
        ),
        Message::tool("call00002", "add", "3"),
        Message::tool(CALL_ID, "get_weather", "Sunny, 21 degrees"),
    ];
    let prompt = render(
        family,
        &spec_agent::template_messages(Some(family.format), &two),
        true,
    );
    let weather = prompt
        .find("to=functions.get_weather<|channel|>")
        .expect("first call");
    let sunny = prompt.find("\"Sunny, 21 degrees\"").expect("its result");
    let add = prompt
        .find("to=functions.add<|channel|>")
        .expect("second call");
    let three = prompt
        .find("<|start|>functions.add to=assistant")
        .expect("its result");
    assert!(weather < sunny && sunny < add && add < three, "{prompt}");
    // A calling turn with text and reasoning (a preamble after the
    // analysis), which the template refuses as such: both as its analysis.
    let mut said = conversation();
    said[2] = Message::assistant_calls(
        "Checking.",
        vec![spec_text::tool_call(CALL_ID, "get_weather", arguments())],
    )
    .with_reasoning("The user wants the weather.");
    let mut both = said.clone();
    both[2].thinking = both[2].reasoning_content.take();
    assert!(
        template(family).render(&both, true).is_err(),
        "refused with both"
    );
    let prompt = render(
        family,
        &spec_agent::template_messages(Some(family.format), &said),
        true,
    );
    assert!(
        prompt.contains(
            "<|channel|>analysis<|message|>The user wants the weather.\n\nChecking.<|end|>"
        ),
        "{prompt}"
    );
    // Unadapted, the second call is dropped and both results are named
    // after the first.
    let raw = render(family, &two, true);
    assert!(!raw.contains("functions.add<|channel|>"), "{raw}");
}
