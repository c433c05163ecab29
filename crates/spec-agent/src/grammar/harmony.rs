//! gpt-oss's harmony responses as grammar: analysis messages and
//! commentary preambles run free, each to its `<|end|>` and the next
//! `<|start|>assistant`; then the message the request asks for: a final
//! answer (free, or under a `response_format`) or one call, the message to
//! `functions.NAME` whose body is the arguments under the tool's schema
//! (the parser also reads the recipient after the channel, with
//! `<|constrain|>json`, as OpenAI's harmony documents it).
//! Generation ends after it (`<|call|>` and `<|return|>` are end tokens).

use spec_grammar::GrammarSpec;

use super::lark::{Lark, ANY};
use super::{calls, response};
use crate::parser::harmony::{CHANNEL, END, MESSAGE, START};
use crate::{AgentError, Tool, ToolFormat};

/// A call of `tool`, after `<|start|>assistant` (the prompt's or a
/// previous message's): the recipient before the channel, as the template
/// writes calls into the history, so a call and its re-rendering in the
/// next turn's prompt are the same tokens.
pub(super) fn call(g: &mut Lark, tool: &Tool) -> String {
    let header = g.lit(&format!(
        " to=functions.{}{CHANNEL}commentary json{MESSAGE}",
        tool.name
    ));
    format!("{header} {}", g.call_json(&tool.parameters))
}

/// The whole response: `forced` a call of one of those tools; otherwise a
/// final answer (under `response_format` when given) or, when `auto` has
/// tools, a call of one of them.
pub(super) fn grammar(
    g: &mut Lark,
    forced: Option<&[&Tool]>,
    auto: &[&Tool],
    response_format: Option<&GrammarSpec>,
) -> Result<String, AgentError> {
    let next = g.lit(&format!("{START}assistant"));
    let analysis = {
        let open = g.lit(&format!("{CHANNEL}analysis{MESSAGE}"));
        let thought = g.text_through(END);
        format!("{open} {thought} {next}")
    };
    let preamble = {
        let open = g.lit(&format!("{CHANNEL}commentary{MESSAGE}"));
        let said = g.text_through(END);
        format!("{open} {said} {next}")
    };
    let lead = g.rule("lead", "", &format!("{analysis} | {preamble}"));
    let last = match forced {
        Some(tools) => calls::call_rest(g, ToolFormat::Harmony, tools, false),
        None => {
            let open = g.lit(&format!("{CHANNEL}final{MESSAGE}"));
            // What the format is written beside: the calls, or at least
            // the analysis messages.
            let with = if auto.is_empty() {
                "reasoning"
            } else {
                "tools"
            };
            let answer = match response_format {
                Some(spec) => response(g, spec, with)?,
                None => format!("{ANY}?"),
            };
            let answer = format!("{open} {answer}");
            if auto.is_empty() {
                answer
            } else {
                let call = calls::call_rest(g, ToolFormat::Harmony, auto, false);
                format!("{answer} | {call}")
            }
        }
    };
    let last = g.rule("last", "", &last);
    Ok(format!("{lead}* {last}"))
}
