//! Chat templates: the Jinja templates tokenizers carry, rendered as
//! transformers renders them (`trim_blocks` and `lstrip_blocks` on, loop
//! controls, Python string and dict methods, `raise_exception`,
//! `strftime_now`, and its `tojson`).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::TextError;

/// One chat turn, as chat templates expect it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or whatever else the template knows.
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl Message {
    /// A turn with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A system turn.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A user turn.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An assistant turn.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

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
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(syntax)?;
        Ok(Self {
            env,
            bos_token: bos_token.map(str::to_owned),
            eos_token: eos_token.map(str::to_owned),
        })
    }

    /// The prompt for `messages`; with `add_generation_prompt` it ends with
    /// the opening of an assistant turn, ready for generation.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let render = render_error;
        let mut context = BTreeMap::from([
            ("messages", Value::from(Serde(messages))),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ]);
        for (name, token) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            if let Some(token) = token {
                context.insert(name, Value::from(token.as_str()));
            }
        }
        self.env
            .get_template(NAME)
            .map_err(render)?
            .render(Value::from(context))
            .map_err(render)
    }
}

/// What transformers appends to the final message to find where it ends.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

impl ChatTemplate {
    /// The prompt for `messages` ending inside the final message, open for
    /// the model to continue it (transformers' `continue_final_message`:
    /// rendered without a generation prompt, cut where the final message's
    /// text ends).
    pub fn render_continuing(&self, messages: &[Message]) -> Result<String, TextError> {
        let Some((last, before)) = messages.split_last() else {
            return Err(TextError::ContinueFinalMessage {
                message: String::new(),
            });
        };
        let mut tagged = before.to_vec();
        tagged.push(Message::new(
            last.role.clone(),
            format!("{}{CONTINUE_TAG}", last.content),
        ));
        let rendered = self.render(&tagged, false)?;
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
mod tests {
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
        let err = render("{{ messages|tojson(sort_keys=true) }}", &messages)
            .expect_err("unknown argument");
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
}
