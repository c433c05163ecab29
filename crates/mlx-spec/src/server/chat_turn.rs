//! The chat path both APIs share: a [`ChatTurn`] (messages, tools, tool
//! choice, template variables) and the generation fields ([`Common`]) are
//! validated, rendered through the model's template, given the output
//! grammar their tools and `response_format` ask for (after any
//! reasoning), admitted and submitted; the generated text comes back
//! parsed into reasoning, content and tool calls ([`TurnEvent`]).

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::{Map, Value};
use spec_agent::{AgentError, OutputParser, Piece, Tool, ToolChoice};
use spec_grammar::GrammarSpec;
use spec_text::Message;

use super::admission::Place;
use super::api::{ApiError, Common, Params};
use super::chat_prompt::Rendered;
use super::generation::{launch, Generation, Prepared, Step};
use super::logprobs::TokenLogprob;
use super::routes::AppState;
use super::worker::Done;

/// One chat turn as the template and the output parser see it, whatever
/// the API it came through.
#[derive(Debug, Clone)]
pub struct ChatTurn {
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// The functions the model may call.
    pub tools: Vec<Tool>,
    /// Whether (and which) it must call.
    pub tool_choice: ToolChoice,
    /// Whether one answer may hold several calls.
    pub parallel_tool_calls: bool,
    /// Extra template variables (`chat_template_kwargs`, e.g.
    /// `enable_thinking`).
    pub template_kwargs: Map<String, Value>,
    /// `Some(n)`: each token's log-probability and `n` alternatives.
    pub logprobs: Option<usize>,
    /// The Responses API's `truncation: "auto"`: where the prompt and
    /// `max_tokens` pass the model's context, the oldest turns are dropped
    /// until they fit ([`drop_oldest_turn`]).
    pub truncate: bool,
}

impl ChatTurn {
    /// A turn of `messages` without tools, template variables or
    /// log-probabilities.
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            template_kwargs: Map::new(),
            logprobs: None,
            truncate: false,
        }
    }
}

/// What a running turn yields, in order.
#[derive(Debug)]
pub enum TurnEvent {
    /// Reasoning, content or a piece of a tool call.
    Piece(Piece),
    /// The log-probabilities of the tokens whose text the pieces that
    /// follow (up to the next `Logprobs`) come from; only when asked for.
    Logprobs(Vec<TokenLogprob>),
    /// The end (its `finish_reason` is the engine's: `stop` or `length`;
    /// an API reports `tool_calls` itself when pieces held calls).
    Done(Box<Done>),
    /// The request failed after it started; nothing follows.
    Error(ApiError),
}

/// A running turn. Dropping it cancels the request; it ends with `Done` or
/// `Error` at the latest at the request's deadline.
pub struct TurnStream {
    generation: Generation,
    parser: OutputParser,
    queue: VecDeque<TurnEvent>,
}

impl TurnStream {
    /// The request's validated generation parameters (`stream`,
    /// `include_usage`, `max_tokens`...).
    pub fn params(&self) -> &Params {
        &self.generation.params
    }

    /// The prompt's length in tokens.
    pub fn prompt_tokens(&self) -> usize {
        self.generation.prompt_tokens
    }

    /// The next event; `None` after `Done` or `Error`.
    pub async fn recv(&mut self) -> Option<TurnEvent> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some(event);
            }
            match self.generation.next().await? {
                Step::Text(text, logprobs) => {
                    if !logprobs.is_empty() {
                        self.queue.push_back(TurnEvent::Logprobs(logprobs));
                    }
                    let pieces = self.parser.push(&text);
                    self.queue.extend(pieces.into_iter().map(TurnEvent::Piece));
                }
                Step::Done(done) => {
                    let pieces = self.parser.finish();
                    self.queue.extend(pieces.into_iter().map(TurnEvent::Piece));
                    self.queue.push_back(TurnEvent::Done(done));
                }
                Step::Failed(e) => self.queue.push_back(TurnEvent::Error(e)),
            }
        }
    }
}

/// Validates, renders, compiles the output grammar, admits (in `place`
/// when it holds one) and submits `turn`; errors before submission are
/// 400s (429 when full), and nothing reaches the engine before every check
/// passed.
pub async fn start_turn(
    state: Arc<AppState>,
    tenant: Option<String>,
    turn: ChatTurn,
    common: Common,
    place: Option<Place>,
) -> Result<TurnStream, ApiError> {
    let logprobs = turn.logprobs;
    let (generation, parser) = launch(
        &state,
        tenant,
        &common,
        logprobs,
        place,
        move |state, params| prepare(state, &turn, params),
    )
    .await?;
    Ok(TurnStream {
        generation,
        parser,
        queue: VecDeque::new(),
    })
}

/// The prompt tokens `turn` would run on with `max_tokens` to generate
/// (tools, template variables and the fallback tools prompt included; its
/// oldest turns dropped where it truncates), without running it.
pub fn render_prompt(
    state: &AppState,
    turn: &ChatTurn,
    max_tokens: usize,
) -> Result<Vec<u32>, ApiError> {
    fitted(state, turn, max_tokens).map(|(_, prompt)| prompt)
}

/// `turn` rendered and encoded; where it truncates and the prompt and
/// `max_tokens` pass the model's context, rendered again without its
/// oldest turn until they fit or only the last user turn is left (which
/// admission then refuses as too long).
fn fitted(
    state: &AppState,
    turn: &ChatTurn,
    max_tokens: usize,
) -> Result<(Rendered, Vec<u32>), ApiError> {
    let rendered = state.chat.render(turn)?;
    let prompt = encode(state, &rendered.text)?;
    let Some(context) = state.context_length.filter(|_| turn.truncate) else {
        return Ok((rendered, prompt));
    };
    if prompt.len() + max_tokens <= context {
        return Ok((rendered, prompt));
    }
    let mut fit = (rendered, prompt);
    let mut shorter = turn.clone();
    let mut dropped = 0;
    while fit.1.len() + max_tokens > context && drop_oldest_turn(&mut shorter.messages) {
        let rendered = state.chat.render(&shorter)?;
        let prompt = encode(state, &rendered.text)?;
        fit = (rendered, prompt);
        dropped += 1;
    }
    if dropped > 0 {
        tracing::debug!(dropped, tokens = fit.1.len(), "truncated the oldest turns");
    }
    Ok(fit)
}

/// Drops the conversation's oldest turn: its first message after the
/// leading system (and developer) messages, and every message after it up
/// to the next user message, so that what is left still opens with a user
/// turn and no tool result outlives its call. `false` when there is no
/// later user message: the last user turn is never dropped.
pub fn drop_oldest_turn(messages: &mut Vec<Message>) -> bool {
    let Some(first) = messages
        .iter()
        .position(|m| m.role != "system" && m.role != "developer")
    else {
        return false;
    };
    let next_user = messages[first + 1..]
        .iter()
        .position(|m| m.role == "user")
        .map(|i| first + 1 + i);
    match next_user {
        Some(end) => {
            messages.drain(first..end);
            true
        }
        None => false,
    }
}

fn encode(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    state
        .tokenizer
        .encode(text, false)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))
}

/// The prompt, the constraint and the output's parser of `turn`.
fn prepare(
    state: &AppState,
    turn: &ChatTurn,
    params: &Params,
) -> Result<(Prepared, OutputParser), ApiError> {
    let (rendered, prompt) = fitted(state, turn, params.max_tokens)?;
    let Rendered {
        format, reasoning, ..
    } = rendered;
    let tools: &[Tool] = if format.is_some() { &turn.tools } else { &[] };
    let grammar = spec_agent::output_grammar(
        reasoning.as_ref().map(|(r, open)| (r, *open)),
        format,
        tools,
        &turn.tool_choice,
        turn.parallel_tool_calls,
        params.response_format.grammar(),
        &|text| state.tokenizer.special_token_id(text),
    )
    .map_err(|e| agent_error(&e))?;
    let constraint = match grammar {
        None => None,
        // Under `auto` the grammar only keeps calls well formed: a model
        // without constrained decoding still answers, its calls parsed.
        Some(_)
            if state.grammar.is_err()
                && matches!(turn.tool_choice, ToolChoice::Auto)
                && params.response_format.grammar().is_none() =>
        {
            None
        }
        Some(spec) => Some(compile(state, &spec, tools, params)?),
    };
    // Call and reasoning markers are special tokens in some vocabularies:
    // the parser must see them.
    let keep_special_tokens = format.is_some() || reasoning.is_some();
    let starts_open = reasoning.as_ref().is_some_and(|(_, open)| *open);
    let parser = OutputParser::new(format, reasoning.map(|(r, _)| r), starts_open, tools);
    let prepared = Prepared {
        prompt,
        constraint,
        keep_special_tokens,
    };
    Ok((prepared, parser))
}

/// The 400 of a turn whose tools, tool choice or response format cannot
/// be composed, naming the field at fault.
pub fn agent_error(e: &AgentError) -> ApiError {
    let param = match e {
        AgentError::UnknownTool { .. } | AgentError::NoTools { .. } => "tool_choice",
        AgentError::Uncombinable { .. } => "response_format",
        _ => "tools",
    };
    ApiError::invalid(e.to_string(), Some(param))
}

/// The output grammar compiled against the model's vocabulary. When the
/// grammar engine refuses it, the tool (or the `response_format`) at fault
/// is named: each one's schema is compiled alone to find it.
fn compile(
    state: &AppState,
    spec: &GrammarSpec,
    tools: &[Tool],
    params: &Params,
) -> Result<Box<dyn spec_core::Constraint>, ApiError> {
    let param = if tools.is_empty() {
        "response_format"
    } else {
        "tools"
    };
    let env = state.grammar.as_deref().map_err(|reason| {
        ApiError::invalid(
            format!("this model has no constrained decoding ({reason}), which tool calls and `response_format` need"),
            Some(param),
        )
    })?;
    let whole = match crate::grammar::compile(env, spec) {
        Ok(constraint) => return Ok(constraint),
        Err(e) => e,
    };
    for (i, tool) in tools.iter().enumerate() {
        if let Err(e) =
            crate::grammar::compile(env, &GrammarSpec::JsonSchema(tool.parameters.clone()))
        {
            return Err(ApiError::invalid(
                format!(
                    "`tools[{i}].function.parameters` (function `{}`): {e}",
                    tool.name
                ),
                Some("tools"),
            ));
        }
    }
    if let Some(format) = params.response_format.grammar() {
        if let Err(e) = crate::grammar::compile(env, format) {
            return Err(ApiError::invalid(
                format!("`response_format` ({}): {e}", params.response_format.kind()),
                Some("response_format"),
            ));
        }
    }
    Err(ApiError::invalid(
        format!("the output grammar of these tools cannot be compiled: {whole}"),
        Some(param),
    ))
}

#[cfg(test)]
mod tests {
    use super::drop_oldest_turn;
    use spec_text::Message;

    fn roles(messages: &[Message]) -> Vec<&str> {
        messages.iter().map(|m| m.role.as_str()).collect()
    }

    #[test]
    fn the_oldest_turn_goes_whole_and_the_last_user_turn_stays() {
        let call = spec_text::tool_call("c1", "f", serde_json::json!({}));
        let mut messages = vec![
            Message::system("rules"),
            Message::user("first"),
            Message::assistant_calls("", vec![call]),
            Message::tool("c1", "f", "result"),
            Message::assistant("done"),
            Message::user("second"),
            Message::assistant("two"),
            Message::user("third"),
        ];
        // The first turn goes with its call and the call's result.
        assert!(drop_oldest_turn(&mut messages));
        assert_eq!(
            roles(&messages),
            ["system", "user", "assistant", "user"],
            "{messages:?}"
        );
        assert_eq!(messages[1].content, "second");
        assert!(drop_oldest_turn(&mut messages));
        assert_eq!(roles(&messages), ["system", "user"]);
        assert_eq!(messages[1].content, "third");
        // The last user turn is never dropped; nor is a lone system message.
        assert!(!drop_oldest_turn(&mut messages));
        assert_eq!(messages.len(), 2);
        let mut alone = vec![Message::system("rules")];
        assert!(!drop_oldest_turn(&mut alone));
    }
}
