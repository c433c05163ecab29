//! The grammar a response must follow, in llguidance's Lark: reasoning that
//! runs free to its close marker, then the body a `tool_choice` or
//! `response_format` asks for, calls written in the model's own syntax with
//! arguments valid under the tools' schemas.

mod calls;
mod gemma;
mod harmony;
mod lark;

use spec_grammar::GrammarSpec;

use crate::tools::{check_tools, find};
use crate::{AgentError, Reasoning, Tool, ToolChoice, ToolFormat};
use lark::{Lark, ANY, WS};

/// The grammar a request's output must follow, in llguidance's Lark
/// ([`GrammarSpec::Lark`]), or `None` when nothing constrains it.
///
/// - `reasoning`: `Some((markers, starts_open))` when the model may think
///   first: reasoning text runs free until the close marker (opened by the
///   model unless `starts_open`), then the body applies.
/// - the body: [`ToolChoice::Required`] is one call of any tool (several
///   when `parallel`), [`ToolChoice::Named`] one call of that tool,
///   [`ToolChoice::Auto`] free text in which any call the model opens must
///   be well formed (with a `response_format`: that format or calls),
///   [`ToolChoice::None`] the `response_format` alone. Calls are in
///   `format` (Hermes when `None`, the fallback), arguments under each
///   tool's schema, closed (objects that do not say otherwise take only
///   their declared properties) and laid out as the templates' `tojson`
///   writes JSON (`", "` and `": "`, no other whitespace).
/// - `special_token`: the id of a text that is one special token of the
///   model's vocabulary (`spec_text::Tokenizer::special_token_id`); markers
///   that are special tokens are named by id.
///
/// Harmony (gpt-oss; the format, or its reasoning markers without tools)
/// is written message by message (`harmony.rs`): one call at most.
pub fn output_grammar(
    reasoning: Option<(&Reasoning, bool)>,
    format: Option<ToolFormat>,
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    response_format: Option<&GrammarSpec>,
    special_token: &dyn Fn(&str) -> Option<u32>,
) -> Result<Option<GrammarSpec>, AgentError> {
    check_tools(tools)?;
    let format = format.unwrap_or(ToolFormat::Hermes);
    // A named function is one call of it, whatever `parallel` says (both
    // APIs force *a* call of that tool).
    let parallel = parallel && !matches!(choice, ToolChoice::Named(_));
    let forced: Option<Vec<&Tool>> = match choice {
        ToolChoice::None => None,
        ToolChoice::Auto => None,
        ToolChoice::Required if tools.is_empty() => {
            return Err(AgentError::NoTools { choice: "required" })
        }
        ToolChoice::Required => Some(tools.iter().collect()),
        ToolChoice::Named(name) => match find(tools, name) {
            Some(tool) => Some(vec![tool]),
            None => {
                let known: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                return Err(AgentError::UnknownTool {
                    name: name.clone(),
                    known: if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    },
                });
            }
        },
    };
    let auto = *choice == ToolChoice::Auto && !tools.is_empty();
    if format == ToolFormat::Harmony || reasoning.is_some_and(|(r, _)| r.is_harmony()) {
        if forced.is_none() && !auto && response_format.is_none() {
            return Ok(None);
        }
        let mut g = Lark::new(special_token);
        let all: Vec<&Tool> = if auto {
            tools.iter().collect()
        } else {
            Vec::new()
        };
        let start = harmony::grammar(&mut g, forced.as_deref(), &all, response_format)?;
        return Ok(Some(GrammarSpec::Lark(g.finish(&start))));
    }
    if forced.is_none() && !auto {
        match (response_format, reasoning) {
            (None, _) => return Ok(None),
            (Some(spec), None) => return Ok(Some(spec.clone())),
            (Some(_), Some(_)) => {}
        }
    }
    let mut g = Lark::new(special_token);
    let body = match (forced, response_format) {
        (Some(tools), _) => calls(&mut g, format, &tools, parallel),
        (None, Some(spec)) if auto => {
            let answer = response(&mut g, spec, "tools")?;
            let all: Vec<&Tool> = tools.iter().collect();
            let calls = calls(&mut g, format, &all, parallel);
            format!("{answer} | {calls}")
        }
        (None, Some(spec)) => response(&mut g, spec, "reasoning")?,
        (None, None) => {
            let all: Vec<&Tool> = tools.iter().collect();
            auto_calls(&mut g, format, &all, parallel)
        }
    };
    let body = g.rule("body", "", &body);
    let start = match reasoning {
        None => body,
        Some((markers, starts_open)) => {
            let thought = g.text_through(markers.close());
            if starts_open {
                format!("{thought} {WS}? {body}")
            } else {
                format!("({WS}? {} {thought} {WS}?)? {body}", g.lit(markers.open()))
            }
        }
    };
    Ok(Some(GrammarSpec::Lark(g.finish(&start))))
}

/// One call of `tools` (several, whitespace between, when `parallel`).
fn calls(g: &mut Lark, format: ToolFormat, tools: &[&Tool], parallel: bool) -> String {
    let rest = calls::call_rest(g, format, tools, parallel);
    let one = match calls::open_marker(format) {
        Some(open) => format!("{} {rest}", g.lit(open)),
        None => rest,
    };
    if parallel && format != ToolFormat::Mistral {
        let one = g.rule("one", "", &one);
        let sep = if format == ToolFormat::Llama3Json {
            format!("(\";\" | {WS})")
        } else {
            format!("{WS}?")
        };
        format!("{one} ({sep} {one})*")
    } else {
        one
    }
}

/// Free text, in which any call the model opens must be well formed.
fn auto_calls(g: &mut Lark, format: ToolFormat, tools: &[&Tool], parallel: bool) -> String {
    let Some(open) = calls::open_marker(format) else {
        // Llama: a response is calls when it opens with `{`, prose otherwise.
        let calls = calls(g, format, tools, parallel);
        return format!("(/[^{{ \\t\\r\\n](.|\\n)*/ | {WS}? {calls})?");
    };
    let rest = calls::call_rest(g, format, tools, parallel);
    let tail = g.text_without(open);
    let head = if g.is_special(open) {
        format!("{ANY}? {}", g.lit(open))
    } else {
        g.rule(
            "head",
            "[lazy]",
            &format!("/(.|\\n)*/ {}", lark::quote(open)),
        )
    };
    let repeat = if parallel { "*" } else { "?" };
    format!("({head} {rest}){repeat} {tail}")
}

/// A `response_format` as a rule; `with` names what it is combined with.
fn response(g: &mut Lark, spec: &GrammarSpec, with: &'static str) -> Result<String, AgentError> {
    match spec {
        GrammarSpec::JsonSchema(schema) => Ok(g.json(schema)),
        GrammarSpec::JsonObject => Ok(g.json(&serde_json::json!({"type": "object"}))),
        GrammarSpec::Regex(regex) => Ok(format!("/{}/", regex.replace('/', "\\/"))),
        GrammarSpec::Lark(_) => Err(AgentError::Uncombinable {
            kind: spec.kind().to_string(),
            with,
        }),
    }
}

#[cfg(test)]
mod tests;
