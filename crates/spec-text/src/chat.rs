//! Chat templates: the Jinja templates tokenizers carry, rendered as
//! transformers renders them (`trim_blocks` and `lstrip_blocks` on, loop
//! controls, Python string and dict methods, `raise_exception`,
//! `strftime_now`, and its `tojson`).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::value::ValueKind;
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::{Message, TextError};

/// The name the template is stored under; it appears in error locations.
const NAME: &str = "chat_template";

/// The template-engine instructions one render may take: real templates
/// take thousands per message, a runaway loop would take forever.
pub const TEMPLATE_FUEL: u64 = 10_000_000;

/// A render's error: out of fuel told apart from the template's own.
fn render_error(source: Error) -> TextError {
    if source.kind() == ErrorKind::OutOfFuel {
        TextError::TemplateFuel {
            limit: TEMPLATE_FUEL,
        }
    } else {
        TextError::TemplateRender { source }
    }
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` become the template
    /// variables of the same names (left undefined when `None`, as in
    /// transformers).
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, TextError> {
        let syntax = |source| TextError::TemplateSyntax { source };
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(syntax)?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_filter("tojson", crate::pyjson::tojson);
        env.add_test("iterable", is_iterable);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(syntax)?;
        Ok(Self {
            env,
            source: source.to_owned(),
            bos_token: bos_token.map(str::to_owned),
            eos_token: eos_token.map(str::to_owned),
        })
    }

    /// The template's text, as compiled (tool-call format detection reads it).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt for `messages`; with `add_generation_prompt` it ends with
    /// the opening of an assistant turn, ready for generation.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.render_with(
            messages,
            &RenderOptions {
                add_generation_prompt,
                ..RenderOptions::default()
            },
        )
    }

    /// The prompt for `messages` under `options`: the tools and the extra
    /// template variables reach the template as transformers passes them
    /// (`tools` is `none` when there are none; kwargs are top-level
    /// variables that never replace `messages`, `tools`,
    /// `add_generation_prompt` or the special tokens).
    pub fn render_with(
        &self,
        messages: &[Message],
        options: &RenderOptions<'_>,
    ) -> Result<String, TextError> {
        let render = render_error;
        let mut context: BTreeMap<&str, Value> = BTreeMap::new();
        if let Some(kwargs) = options.kwargs {
            for (name, value) in kwargs {
                context.insert(name.as_str(), Value::from(Serde(value)));
            }
        }
        context.insert("messages", Value::from(Serde(messages)));
        context.insert(
            "add_generation_prompt",
            Value::from(options.add_generation_prompt),
        );
        context.insert(
            "tools",
            options
                .tools
                .map_or(Value::from(()), |tools| Value::from(Serde(tools))),
        );
        for (name, token) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            match token {
                Some(token) => context.insert(name, Value::from(token.as_str())),
                // Undefined, as in transformers, even if a kwarg named it.
                None => context.remove(name),
            };
        }
        self.env
            .get_template(NAME)
            .map_err(render)?
            .render(Value::from(context))
            .map_err(render)
    }
}

/// How [`ChatTemplate::render_with`] renders, beyond the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// End with the opening of an assistant turn, ready for generation.
    pub add_generation_prompt: bool,
    /// The tools the model may call, in the OpenAI/transformers shape
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub tools: Option<&'a [serde_json::Value]>,
    /// Extra template variables (an API's `chat_template_kwargs`, e.g.
    /// `enable_thinking`).
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// What transformers appends to the final message to find where it ends.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

impl ChatTemplate {
    /// The prompt for `messages` ending inside the final message, open for
    /// the model to continue it (transformers' `continue_final_message`:
    /// rendered without a generation prompt, cut where the final message's
    /// text ends).
    pub fn render_continuing(&self, messages: &[Message]) -> Result<String, TextError> {
        self.render_continuing_with(messages, None)
    }

    /// [`Self::render_continuing`] with extra template variables (as
    /// [`RenderOptions::kwargs`]).
    pub fn render_continuing_with(
        &self,
        messages: &[Message],
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, TextError> {
        let Some((last, before)) = messages.split_last() else {
            return Err(TextError::ContinueFinalMessage {
                message: String::new(),
            });
        };
        let mut tagged = before.to_vec();
        tagged.push(Message {
            content: format!("{}{CONTINUE_TAG}", last.content),
            ..last.clone()
        });
        let rendered = self.render_with(
            &tagged,
            &RenderOptions {
                kwargs,
                ..RenderOptions::default()
            },
        )?;
        let refuse = || TextError::ContinueFinalMessage {
            message: last.content.clone(),
        };
        let tag = CONTINUE_TAG.trim();
        if !rendered.contains(last.content.trim()) {
            return Err(refuse());
        }
        let at = rendered.rfind(tag).ok_or_else(refuse)?;
        Ok(if rendered[at..].starts_with(CONTINUE_TAG) {
            rendered[..at].to_owned()
        } else {
            // The template trimmed the message's trailing space.
            rendered[..at].trim_end().to_owned()
        })
    }
}

/// `value is iterable` as in Python's Jinja: `none`, numbers and booleans
/// are not (minijinja's own test says yes to `none`, and templates such as
/// Qwen3-Coder's then take the length of `tools=none`).
fn is_iterable(value: &Value) -> bool {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
        ValueKind::Undefined
        | ValueKind::String
        | ValueKind::Bytes
        | ValueKind::Seq
        | ValueKind::Map
        | ValueKind::Iterable => true,
        _ => value.try_iter().is_ok(),
    }
}

/// `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the local time, formatted like Python's `strftime`.
fn strftime_now(format: String) -> Result<String, Error> {
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tool_tests;
