//! Tools, tool turns and template kwargs reach the template as transformers
//! passes them.

use serde_json::json;

use super::*;
use crate::tool_call;

/// A small Hermes-style template: tools as JSON lines in the system turn,
/// calls as `<tool_call>` JSON with the arguments object, tool results in a
/// `tool` turn, and a thinking switch.
const TEMPLATE: &str = "{% if tools %}<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{% endif %}\
{% for m in messages %}<|{{ m.role }}|>\
{% if m.role == 'tool' %}[{{ m.tool_call_id }}:{{ m.name }}] {% endif %}\
{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}\
{{ m.content }}\
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}</tool_call>\
{% if c.function.arguments.city is string %}(city is a string){% endif %}{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}\
{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}";

fn weather_tool() -> serde_json::Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }
    })
}

fn conversation() -> Vec<Message> {
    vec![
        Message::user("Weather in Paris?"),
        Message::assistant_calls(
            "",
            vec![tool_call("call_1", "get_weather", json!({"city": "Paris"}))],
        ),
        Message::tool("call_1", "get_weather", "sunny, 21C"),
    ]
}

#[test]
fn tools_calls_and_tool_results_render() {
    let template = ChatTemplate::new(TEMPLATE, None, None).expect("compile");
    let tools = [weather_tool()];
    let out = template
        .render_with(
            &conversation(),
            &RenderOptions {
                add_generation_prompt: true,
                tools: Some(&tools),
                kwargs: None,
            },
        )
        .expect("render");
    assert_eq!(
        out,
        "<tools>\n\
         {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather in a city\", \
         \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n\
         </tools>\n\
         <|user|>Weather in Paris?\n\
         <|assistant|><tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>(city is a string)\n\
         <|tool|>[call_1:get_weather] sunny, 21C\n\
         <|assistant|>"
    );
}

#[test]
fn without_tools_nothing_changes() {
    let template = ChatTemplate::new(TEMPLATE, None, None).expect("compile");
    let messages = [Message::user("hi")];
    let plain = template.render(&messages, true).expect("render");
    assert_eq!(plain, "<|user|>hi\n<|assistant|>");
    // `tools` is none, as transformers passes it, not undefined (booleans
    // and none print as Python prints them).
    let probe = ChatTemplate::new(
        "{{ tools is defined }}/{{ tools is none }}/{{ messages[0].tool_calls is defined }}",
        None,
        None,
    )
    .expect("compile");
    assert_eq!(
        probe.render(&messages, false).expect("render"),
        "True/True/False"
    );
}

#[test]
fn iterable_is_pythons_test() {
    let probe = ChatTemplate::new(
        "{{ none is iterable }}/{{ 1 is iterable }}/{{ 'a' is iterable }}/{{ [] is iterable }}/{{ messages[0] is iterable }}/{{ nothing is iterable }}",
        None,
        None,
    )
    .expect("compile");
    assert_eq!(
        probe.render(&[Message::user("hi")], false).expect("render"),
        "False/False/True/True/True/True"
    );
}

#[test]
fn kwargs_reach_the_template_but_never_replace_its_inputs() {
    let template = ChatTemplate::new(TEMPLATE, None, None).expect("compile");
    let messages = [Message::user("hi")];
    let kwargs = json!({"enable_thinking": false, "messages": [], "add_generation_prompt": false});
    let kwargs = kwargs.as_object().expect("object");
    let options = RenderOptions {
        add_generation_prompt: true,
        tools: None,
        kwargs: Some(kwargs),
    };
    assert_eq!(
        template.render_with(&messages, &options).expect("render"),
        "<|user|>hi\n<|assistant|><think></think>"
    );
    let tokens = ChatTemplate::new(
        "{{ bos_token }}|{{ eos_token }}|{{ tools }}",
        Some("<s>"),
        None,
    )
    .expect("compile");
    let kwargs = json!({"bos_token": "X", "eos_token": "Y", "tools": "Z"});
    let rendered = tokens
        .render_with(
            &messages,
            &RenderOptions {
                kwargs: kwargs.as_object(),
                ..RenderOptions::default()
            },
        )
        .expect("render");
    assert_eq!(rendered, "<s>||None");
}

#[test]
fn reasoning_content_renders_and_continuing_keeps_tool_fields() {
    let template = ChatTemplate::new(TEMPLATE, None, None).expect("compile");
    let messages = [
        Message::user("2+2?"),
        Message::assistant("4").with_reasoning("two and two"),
    ];
    assert_eq!(
        template.render(&messages, false).expect("render"),
        "<|user|>2+2?\n<|assistant|><think>two and two</think>4\n"
    );
    assert_eq!(
        template.render_continuing(&messages).expect("render"),
        "<|user|>2+2?\n<|assistant|><think>two and two</think>4"
    );
    assert_eq!(template.source(), TEMPLATE);
}
