//! `mlx-spec cache-prompt`: prefill a prompt and save the model's caches in
//! mlx-lm's prompt-cache format (as `mlx_lm.cache_prompt`), for
//! `generate --prompt-cache-file` here or in mlx-lm.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use spec_formats::prompt_cache::{self, ModelIdentity};
use spec_text::{Message, Tokenizer};

use crate::memory_plan::MemoryPlan;
use crate::model_source;

/// Arguments of `cache-prompt` (named as `mlx_lm.cache_prompt` names them
/// where it has them).
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (mlx-lm / Hugging Face) or GGUF file; default: SmolLM2-135M-Instruct.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt (`-` reads standard input).
    #[arg(
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// The `.safetensors` file to write.
    #[arg(long, alias = "prompt-cache-file")]
    out: PathBuf,
    /// Use the prompt as is, without the chat template.
    #[arg(long)]
    no_chat_template: bool,
    /// Run the file's dtype and quantization. Without it: float32 weights
    /// where they take at most 75% of the memory available, else the
    /// file's own (as `generate` chooses, so its files fit `generate`'s).
    #[arg(long)]
    keep_dtype: bool,
    #[command(flatten)]
    load: crate::load_args::LoadArgs,
}

/// What mlx-lm's `cache_prompt` records as `tokenizer_config` without
/// `--eos-token` (`json.dumps` of its tokenizer options).
pub const TOKENIZER_CONFIG: &str = r#"{"trust_remote_code": false}"#;

/// The name files record for `--model` (mlx-lm's `model` entry: the
/// argument as given).
pub fn model_name(arg: Option<&Path>, resolved: &Path) -> String {
    arg.unwrap_or(resolved).to_string_lossy().into_owned()
}

/// The cached prompt's tokens: through the chat template as an open user
/// turn (mlx-lm's `continue_final_message=True`), else encoded with the
/// tokenizer's special tokens.
fn prompt_tokens(tokenizer: &Tokenizer, text: &str, no_chat_template: bool) -> Result<Vec<u32>> {
    let template = if no_chat_template || tokenizer.chat_template_source().is_none() {
        None
    } else {
        Some(tokenizer.chat_template()?)
    };
    Ok(match template {
        Some(t) => tokenizer.encode(&t.render_continuing(&[Message::user(text)])?, false)?,
        None => tokenizer.encode(text, true)?,
    })
}

pub fn run(args: Args) -> Result<()> {
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) if p == "-" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s
        }
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, None) => bail!("give --prompt or --prompt-file"),
    };
    let path = model_source::resolve(args.model.clone())?;
    let tokenizer = model_source::tokenizer(&path)?;
    let policy = MemoryPlan::new().target(&path, args.keep_dtype, false, &args.load);
    let model = model_source::load(&path, policy, &args.load)?;
    let identity = ModelIdentity::new(
        model_name(args.model.as_deref(), &path),
        &path,
        policy,
        args.load.adapter_path.as_deref(),
    )?;
    let tokens = prompt_tokens(&tokenizer, &text, args.no_chat_template)?;
    let start = Instant::now();
    let caches = prompt_cache::prefill(&model, &tokens)?;
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "Processed {} tokens ({:.2} tok/s)",
        tokens.len(),
        tokens.len() as f64 / seconds.max(1e-9)
    );
    let metadata = BTreeMap::from([("tokenizer_config".to_owned(), TOKENIZER_CONFIG.to_owned())]);
    prompt_cache::save_prompt_cache(&args.out, &caches, &tokens, &identity, &metadata)?;
    // The file's own size: a cache's buffers may hold more than its
    // file (room to grow, rows a bounded window no longer needs).
    let bytes = std::fs::metadata(&args.out)
        .with_context(|| format!("reading {}", args.out.display()))?
        .len();
    println!(
        "Saved {} ({:.3} MB)",
        args.out.display(),
        bytes as f64 / 1e6
    );
    Ok(())
}
