//! `mlx-spec chat`: a conversation at the terminal, as `mlx_lm.chat`
//! holds one, each answer speculated by one draft provider.
//!
//! Every turn renders the whole conversation (the system message, the
//! earlier turns, the new message) with the chat template and runs on the
//! engine with its prefix cache on: a turn starts from the caches the
//! previous turn left (its prompt and answer, trimmed back where the
//! template renders the history otherwise, e.g. a thinking model's earlier
//! reasoning dropped), so its answer is the one a fresh request of the same
//! conversation gets, token for token. mlx-lm 0.32.2's `chat` instead
//! renders the system message and the new message alone each turn and
//! appends them to one running cache: its later turns miss the end-of-turn
//! token after each answer and repeat the system message (and whatever else
//! the template puts before a conversation) every turn.

use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result};
use serve_loop::{PrefixCacheConfig, Request, ScheduleConfig};
use spec_text::{ChatTemplate, Message, RenderOptions, Tokenizer};

use crate::answer_printer::{self, Printer};
use crate::local_engine::{Local, Setup};
use crate::sampling_args::SamplingArgs;
use crate::signals::{self, SignalKind};
use crate::{cmd_generate, model_source};

/// Arguments of `chat` (mlx-lm's names, and `generate`'s speculation).
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (mlx-lm / Hugging Face) or GGUF file; default:
    /// SmolLM2-135M-Instruct.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The system message opening the conversation: its text, or the file
    /// holding it (as later mlx-lm releases read it: a value starting with
    /// `./`, `../`, `/` or `~`, or naming a file that exists).
    #[arg(long, visible_alias = "system-prompt")]
    system: Option<String>,
    /// Most tokens of each answer.
    #[arg(long, short = 'm', default_value_t = 256)]
    max_tokens: usize,
    /// Extra variables for the chat template, a JSON object (e.g.
    /// `{"enable_thinking": false}`).
    #[arg(long, value_name = "JSON")]
    chat_template_config: Option<String>,
    /// After each answer, its stats line (prompt tokens computed and taken
    /// from the cache, speeds, the provider's acceptance).
    #[arg(long)]
    verbose: bool,
    /// Bytes of the conversation's caches kept between turns (each turn
    /// starts from the longest prefix they hold); 0 prefills every turn's
    /// whole conversation again.
    #[arg(long, default_value_t = serve_loop::DEFAULT_PREFIX_CACHE_BYTES)]
    prompt_cache_bytes: usize,
    /// Run the file's dtype and quantization (see `generate --keep-dtype`).
    #[arg(long)]
    keep_dtype: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    prefill: crate::prefill_args::PrefillArgs,
    #[command(flatten)]
    speculation: crate::draft_args::DraftArgs,
    #[command(flatten)]
    cache_dir: crate::prompt_cache_dir::DirArgs,
    #[command(flatten)]
    load: crate::load_args::LoadArgs,
}

/// The commands a line may be (mlx-lm's), and how to send several lines.
const HELP: &str = "The command list:\n- 'q' to exit\n- 'r' to reset the chat\n- 'h' to display these commands\n- '\"\"\"' to start and end a message of several lines";

/// What opens and closes a message of several lines (as ollama's prompt).
const QUOTES: &str = "\"\"\"";

/// The rest of a message of several lines whose first line followed the
/// opening quotes: lines (each after a `... ` prompt) until one ends with
/// the closing quotes, which are dropped.
fn block(opened: &str, inputs: &Inputs) -> Result<Result<String, End>> {
    let mut text = opened.to_owned();
    loop {
        if let Some(done) = text.strip_suffix(QUOTES) {
            return Ok(Ok(done.to_owned()));
        }
        print!("... ");
        std::io::stdout().flush()?;
        match inputs.line()? {
            Ok(line) => {
                text.push('\n');
                text.push_str(&line);
            }
            Err(end) => return Ok(Err(end)),
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    let system = match &args.system {
        Some(value) => Some(system_text(value)?),
        None => None,
    };
    let path = model_source::resolve(args.model.clone())?;
    let tokenizer = Arc::new(model_source::tokenizer(&path)?);
    let template = tokenizer.chat_template().with_context(|| {
        format!(
            "chat needs the model's chat template ({}); `generate --no-chat-template` takes raw text",
            path.display()
        )
    })?;
    let kwargs = match &args.chat_template_config {
        Some(text) => Some(crate::json_arg::object("--chat-template-config", text)?),
        None => None,
    };
    let mut setup = Setup::planned(
        path.clone(),
        args.keep_dtype,
        &args.load,
        Some(&args.speculation),
        Arc::clone(&tokenizer),
    )?;
    setup.store = args.cache_dir.open(
        args.model.as_deref(),
        &path,
        setup.policy,
        args.load.adapter_path.as_deref(),
    )?;
    let config = serve_loop::EngineConfig {
        prefix_cache: PrefixCacheConfig {
            max_bytes: args.prompt_cache_bytes,
            ..PrefixCacheConfig::default()
        },
        schedule: args.prefill.schedule(ScheduleConfig::default().max_batch),
        ..serve_loop::EngineConfig::default()
    };
    let local = Local::start(config, setup)?;
    let chat = Chat {
        args: &args,
        tokenizer: &tokenizer,
        template: &template,
        harmony: spec_agent::Reasoning::detect(template.source()).filter(|r| r.is_harmony()),
        kwargs: kwargs.as_ref(),
        local: &local,
    };
    println!("[INFO] Starting chat session with {}.", path.display());
    println!("{HELP}");
    let result = chat.converse(system, &Inputs::start()?);
    local.engine.shutdown()?;
    match result? {
        End::Quit => Ok(()),
        // As the shell reports a command Ctrl-C ended.
        End::Interrupted => std::process::exit(130),
    }
}

/// `--system-prompt`'s text: read from the file it names when it looks
/// like a path or names a file that exists (later mlx-lm releases' rule).
fn system_text(value: &str) -> Result<String> {
    if !names_file(value) {
        return Ok(value.to_owned());
    }
    let path = match (value.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(value),
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("--system-prompt: reading {}", path.display()))?;
    println!("System prompt loaded from {}", path.display());
    Ok(text.trim().to_owned())
}

/// Whether `--system-prompt`'s value names a file.
fn names_file(value: &str) -> bool {
    ["./", "../", "/", "~"].iter().any(|p| value.starts_with(p)) || Path::new(value).is_file()
}

/// What the prompt gets.
enum Input {
    /// A line of standard input, its end of line included.
    Line(String),
    /// The end of standard input.
    End,
    /// Reading standard input failed.
    Failed(std::io::Error),
    /// Ctrl-C, while no answer ran.
    Interrupt,
}

/// How a chat ended.
enum End {
    /// `q` or the end of the input.
    Quit,
    /// Ctrl-C at the prompt.
    Interrupted,
}

/// Standard input's lines, read on a thread of their own, and Ctrl-C, on
/// one channel. Ctrl-C while an answer runs stops that answer instead (the
/// conversation keeps what it said); at the prompt it ends the chat.
struct Inputs {
    events: Receiver<Input>,
    /// The cancel flag of the answer running, if one is.
    answering: Arc<Mutex<Option<Arc<AtomicBool>>>>,
}

impl Inputs {
    fn start() -> Result<Inputs> {
        let (events_tx, events) = channel();
        let lines = events_tx.clone();
        std::thread::Builder::new()
            .name("chat-input".into())
            .spawn(move || loop {
                let mut line = String::new();
                let input = match std::io::stdin().lock().read_line(&mut line) {
                    Ok(0) => Input::End,
                    Ok(_) => Input::Line(line),
                    Err(e) => Input::Failed(e),
                };
                let last = !matches!(input, Input::Line(_));
                if lines.send(input).is_err() || last {
                    return;
                }
            })
            .context("starting the thread reading standard input")?;
        let answering = Arc::new(Mutex::new(None::<Arc<AtomicBool>>));
        let current = Arc::clone(&answering);
        signals::watch("chat-interrupt", &[SignalKind::interrupt()], move |_| {
            let running = current.lock().unwrap_or_else(PoisonError::into_inner);
            match running.as_ref() {
                Some(cancel) => {
                    cancel.store(true, Ordering::SeqCst);
                    ControlFlow::Continue(())
                }
                None if events_tx.send(Input::Interrupt).is_ok() => ControlFlow::Continue(()),
                None => ControlFlow::Break(()),
            }
        });
        Ok(Inputs { events, answering })
    }

    /// The next line, without its end of line, or how the chat ends (the
    /// end of the input or Ctrl-C at the prompt, a newline printed).
    fn line(&self) -> Result<Result<String, End>> {
        let end = match self.events.recv().unwrap_or(Input::End) {
            Input::Line(line) => return Ok(Ok(line.trim_end_matches(['\n', '\r']).to_owned())),
            Input::Failed(e) => return Err(e).context("reading standard input"),
            Input::End => End::Quit,
            Input::Interrupt => End::Interrupted,
        };
        println!();
        Ok(Err(end))
    }

    /// Runs `answer` with a cancel flag that Ctrl-C sets meanwhile.
    fn answering<T>(&self, answer: impl FnOnce(Arc<AtomicBool>) -> T) -> T {
        let cancel = Arc::new(AtomicBool::new(false));
        *self
            .answering
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&cancel));
        let result = answer(cancel);
        *self
            .answering
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        result
    }
}

/// What each turn needs.
struct Chat<'a> {
    args: &'a Args,
    tokenizer: &'a Arc<Tokenizer>,
    template: &'a ChatTemplate,
    /// gpt-oss's analysis markers when the template writes harmony: its
    /// answers go back into the history message by message.
    harmony: Option<spec_agent::Reasoning>,
    kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
    local: &'a Local,
}

impl Chat<'_> {
    /// Reads lines until `q`, the end of the input or Ctrl-C at the
    /// prompt, answering each.
    fn converse(&self, system: Option<String>, inputs: &Inputs) -> Result<End> {
        let opening: Vec<Message> = system.into_iter().map(Message::system).collect();
        let mut messages = opening.clone();
        loop {
            print!(">> ");
            std::io::stdout().flush()?;
            let line = match inputs.line()? {
                Ok(line) => line,
                Err(end) => return Ok(end),
            };
            let query = match line.strip_prefix(QUOTES) {
                Some(opened) => match block(opened, inputs)? {
                    Ok(text) => text,
                    Err(end) => return Ok(end),
                },
                None => line,
            };
            let query = query.as_str();
            match query {
                "" => continue,
                "q" => return Ok(End::Quit),
                "r" => {
                    messages.clone_from(&opening);
                    continue;
                }
                "h" => {
                    println!("{HELP}");
                    continue;
                }
                _ => {}
            }
            messages.push(Message::user(query.to_owned()));
            match inputs.answering(|cancel| self.answer(&messages, cancel)) {
                Ok(answer) => messages.push(answer),
                Err(e) => {
                    // The turn is dropped; the conversation goes on without
                    // it unless the engine itself is gone.
                    messages.pop();
                    eprintln!("error: {}", spec_core::error::report(e.as_ref()));
                    if let Some(panic) = self.local.engine.failure() {
                        anyhow::bail!("the engine stopped: {panic}");
                    }
                }
            }
        }
    }

    /// Renders the conversation, prints the answer as it comes (until it
    /// ends or `cancel` is set) and returns it as the history's message.
    fn answer(&self, messages: &[Message], cancel: Arc<AtomicBool>) -> Result<Message> {
        let options = RenderOptions {
            add_generation_prompt: true,
            kwargs: self.kwargs,
            ..RenderOptions::default()
        };
        let format = self
            .harmony
            .as_ref()
            .map(|_| spec_agent::ToolFormat::Harmony);
        let messages = spec_agent::template_messages(format, messages);
        let text = self.template.render_with(&messages, &options)?;
        let prompt = self.tokenizer.encode(&text, false)?;
        let prompt_len = prompt.len();
        let args = self.args;
        let sampler = args.sampling.sampler(self.tokenizer)?;
        let request = Request {
            eos: self.tokenizer.eos_token_ids().iter().copied().collect(),
            processors: args.sampling.penalties().processors(None)?,
            speculation: self.local.speculation(&args.speculation, sampler.seed),
            sampler,
            cancel: Some(cancel),
            ..Request::new(prompt, args.max_tokens)
        };
        mlx_rs::memory::reset_peak_memory()?;
        let printer = Printer::new(Arc::clone(self.tokenizer), &[]);
        let done = answer_printer::run_printed(&self.local.engine, request, printer)?;
        let output = &done.output;
        if args.verbose {
            let line = cmd_generate::stats_line(
                args.speculation.provider(),
                output,
                prompt_len,
                output.cached_tokens,
            )?;
            println!("{line}");
        }
        Ok(match &self.harmony {
            Some(harmony) => {
                harmony_message(harmony, &self.tokenizer.decode(&output.tokens, false)?)
            }
            None => Message::assistant(self.tokenizer.decode(&output.tokens, true)?),
        })
    }
}

/// A harmony answer (its special tokens decoded) as the history's message:
/// the final channel its content, the analysis its reasoning (which the
/// template drops from earlier turns).
fn harmony_message(harmony: &spec_agent::Reasoning, text: &str) -> Message {
    let mut parser = spec_agent::OutputParser::new(None, Some(harmony.clone()), false, &[]);
    let mut pieces = parser.push(text);
    pieces.extend(parser.finish());
    let parsed = spec_agent::Parsed::of(&pieces);
    let message = Message::assistant(parsed.content);
    if parsed.reasoning.is_empty() {
        message
    } else {
        message.with_reasoning(parsed.reasoning)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gpt-oss answer goes back into the history as its final message,
    /// the template dropping its analysis: gpt-oss's own template
    /// (spec-agent's fixture) renders the next turn's prompt.
    #[test]
    fn harmony_answers_go_back_as_their_final_message() {
        let source = include_str!("../../spec-agent/tests/templates/gpt-oss.jinja");
        let template = ChatTemplate::new(source, None, Some("<|return|>")).expect("template");
        let harmony = spec_agent::Reasoning::detect(source)
            .filter(|r| r.is_harmony())
            .expect("harmony");
        let answer = harmony_message(
            &harmony,
            "<|channel|>analysis<|message|>Greet back.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
        );
        assert_eq!(answer.content, "Hello!");
        assert_eq!(answer.reasoning_content.as_deref(), Some("Greet back."));
        let history = vec![Message::user("Hi"), answer, Message::user("Bye")];
        let messages =
            spec_agent::template_messages(Some(spec_agent::ToolFormat::Harmony), &history);
        let prompt = template.render(&messages, true).expect("render");
        assert!(
            prompt.ends_with(
                "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|>\
                 <|start|>user<|message|>Bye<|end|><|start|>assistant"
            ),
            "{prompt}"
        );
        // Text outside any message stays the answer.
        assert_eq!(
            harmony_message(&harmony, "Plain words.").content,
            "Plain words."
        );
    }

    #[test]
    fn the_system_prompt_is_a_text_or_the_file_it_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("system.txt");
        std::fs::write(&file, "  Be brief.\n").expect("write");
        let name = file.to_str().expect("utf-8");
        assert!(names_file(name));
        assert_eq!(system_text(name).expect("read"), "Be brief.");
        assert_eq!(system_text("Be kind.").expect("text"), "Be kind.");
        assert!(!names_file("Be kind."));
        let missing = dir.path().join("none.txt");
        let e = system_text(missing.to_str().expect("utf-8"))
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("--system-prompt") && e.contains("none.txt"),
            "{e}"
        );
    }
}
