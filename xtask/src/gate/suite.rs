//! What the speculative gates (and `bench spec`) share: the prompt suite, the drafter
//! checkpoints, the list of registered providers, and running our
//! `spec_run` example (`crates/mlx-spec/examples/spec_run.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

use crate::{real_model, shell, venv};
use spec_fixtures::rng::SplitMix64;

/// The prompt suite: input-grounded prompts (code edits, quoting summaries,
/// JSON rewrites) and open-ended ones, plus edits that ask for the edited
/// text back and nothing else (code, JSON, YAML, tables, prose of 40-130
/// tokens): the workload prompt lookup is for.
#[derive(Debug, Deserialize)]
pub struct Suite {
    pub input_grounded: Vec<String>,
    pub open_ended: Vec<String>,
    pub edit_and_return: Vec<String>,
}

pub fn suite() -> Result<Suite> {
    let path = shell::root()
        .join("xtask")
        .join("prompts")
        .join("spec_suite.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `{"prompts": [{"text": .., "chat": true}, ..]}` for spec_run.
pub fn chat_prompts(texts: &[String]) -> Value {
    serde_json::json!({ "prompts": texts.iter().map(|t| serde_json::json!({"text": t, "chat": true})).collect::<Vec<_>>() })
}

/// Token-id prompts for synthetic models: random ones, and ones that repeat
/// a phrase (so prompt lookup has something to find).
pub fn id_prompts(vocab: u64, count: usize) -> Value {
    let prompts: Vec<Value> = (0..count)
        .map(|i| {
            let mut rng = SplitMix64::keyed(0x5350_4543, &format!("spec prompt {i}"));
            let len = 3 + rng.below(40) as usize;
            let mut ids: Vec<u64> = (0..len).map(|_| rng.below(vocab)).collect();
            if i % 2 == 1 {
                let phrase = ids.clone();
                ids.extend(phrase.iter().take(len / 2));
                ids.extend(phrase);
            }
            serde_json::json!({ "ids": ids })
        })
        .collect();
    serde_json::json!({ "prompts": prompts })
}

/// Provider ids the host binary links, from `mlx-spec providers`.
pub fn registered_providers() -> Result<Vec<String>> {
    shell::release_build()?;
    let out = shell::release_bin("mlx-spec")
        .arg("providers")
        .output()
        .context("running mlx-spec providers")?;
    if !out.status.success() {
        bail!(
            "mlx-spec providers failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        // A provider's line starts at the margin; the lines under it
        // (indented) describe its request options.
        .filter(|l| !l.starts_with(char::is_whitespace))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect())
}

/// The synthetic gate targets the speculative gates run, each with the
/// synthetic checkpoint `draft-model` drafts with on it. Most id prompts run
/// past the gemma4 targets' sliding window of 8: their rollbacks happen past
/// the window (no fallback to plain decoding).
pub const TARGET_DRAFTS: &[(&str, &str)] = &[
    ("llama3", "llama"),
    ("qwen3", "qwen2"),
    ("llama-q4g64", "llama-mixed"),
    ("glm", "glm-q4g64"),
    ("glm-q8g32", "glm-q4g64"),
    ("glm52", "glm52-q4g64"),
    ("glm52-mxfp4", "glm52"),
    ("gemma4-text", "llama"),
    ("gemma4-shared", "qwen2"),
    ("gemma4-moe", "llama"),
];

/// Providers that draft for one architecture only (model name prefix):
/// they refuse every other target by design.
const ARCH_ONLY: &[(&str, &str)] = &[("glm52-native-mtp", "glm"), ("gemma4-assistant", "gemma4")];

/// Whether `provider` can run on the gate model called `model`.
pub fn applies(provider: &str, model: &str) -> bool {
    ARCH_ONLY
        .iter()
        .all(|(id, arch)| *id != provider || model.starts_with(arch))
}

/// One target a speculative gate runs every provider on.
pub struct Case {
    /// The model's name (the real model's or a synthetic checkpoint's).
    pub label: String,
    pub model: PathBuf,
    /// A `{"prompts": [...]}` value for spec_run.
    pub prompts: Value,
    /// Provider ids to run: `plain` first, then every registered provider
    /// that applies to the model (not `deepspec`: it needs a DSpark
    /// checkpoint made for its target, `gate dspark` covers it).
    pub providers: Vec<String>,
    /// `--option`s naming the drafters: `draft-model`'s checkpoint, and the
    /// synthetic Gemma-4 assistant (shaped for the synthetic Gemma-4 targets'
    /// widths and vocabulary) on every gemma4 target.
    pub options: Vec<String>,
}

impl Case {
    /// The providers other than `plain`.
    pub fn speculative(&self) -> impl Iterator<Item = &String> {
        self.providers.iter().filter(|p| *p != "plain")
    }
}

/// The cases of the gates that run every provider on every gate model: the
/// real model on `real_texts` as chat prompts (its drafter a 4-bit copy of
/// it), then each of [`TARGET_DRAFTS`] on `synthetic_prompts` token-id
/// prompts. Builds the runner and makes the checkpoints it lacks.
pub fn provider_cases(
    python: &Path,
    real_texts: &[String],
    synthetic_prompts: usize,
) -> Result<Vec<Case>> {
    let synthetic = crate::synth::ensure_with_assistants(python)?;
    build_runner()?;
    let registered: Vec<String> = registered_providers()?
        .into_iter()
        .filter(|p| p != "deepspec")
        .collect();
    let dir_of = |name: &str| -> Result<PathBuf> {
        synthetic
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.dir.clone())
            .with_context(|| format!("no synthetic {name} checkpoint"))
    };
    let assistant = dir_of("gemma4-assistant")?;
    let case = |label: &str, model: PathBuf, prompts: Value, drafter: &Path| {
        let mut providers = vec!["plain".to_owned()];
        providers.extend(registered.iter().filter(|p| applies(p, label)).cloned());
        let mut options = vec![format!("draft-model:model={}", drafter.display())];
        if label.starts_with("gemma4") {
            options.push(format!("gemma4-assistant:model={}", assistant.display()));
        }
        Case {
            label: label.to_owned(),
            model,
            prompts,
            providers,
            options,
        }
    };
    let mut cases = vec![case(
        real_model::NAME,
        real_model::ensure()?,
        chat_prompts(real_texts),
        &real_drafter(python)?,
    )];
    for &(target, draft) in TARGET_DRAFTS {
        cases.push(case(
            target,
            dir_of(target)?,
            id_prompts(320, synthetic_prompts),
            &dir_of(draft)?,
        ));
    }
    Ok(cases)
}

/// A 4-bit (group 64) copy of the real model, made by mlx-lm's own
/// quantizer: a drafter of the same vocabulary that disagrees with the
/// target often enough to exercise rejection and rollback.
pub fn real_drafter(python: &Path) -> Result<PathBuf> {
    let target = real_model::ensure()?;
    let dir = shell::root()
        .join("target")
        .join("gate-models")
        .join("smollm2-135m-q4-drafter");
    if !dir.join("config.json").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        shell::run(
            venv::python_command(python)
                .args(["-m", "mlx_lm", "convert", "--hf-path"])
                .arg(&target)
                .arg("--mlx-path")
                .arg(&dir)
                .args(["-q", "--q-bits", "4", "--q-group-size", "64"]),
        )
        .context("making the drafter with mlx_lm convert")?;
    }
    Ok(dir)
}

/// One spec_run invocation.
pub struct SpecRun<'a> {
    pub model: &'a Path,
    pub prompts: &'a Value,
    pub providers: &'a [String],
    pub options: &'a [String],
    pub extra: &'a [&'a str],
    pub max_tokens: usize,
    pub work: &'a Path,
    pub label: &'a str,
    /// Environment of the run (e.g. `OPENBLAS_NUM_THREADS`).
    pub env: &'a [(&'a str, &'a str)],
}

/// One prompt's result.
#[derive(Debug, Clone, Deserialize)]
pub struct RunResult {
    pub tokens: Vec<u32>,
    pub generation_seconds: f64,
    pub drafted: usize,
    pub accepted: usize,
    pub drafting_rounds: usize,
    pub target_calls: usize,
    /// `Eos`, `MaxTokens`, ... (`Debug` of `serve_loop::Finish`).
    #[serde(default)]
    pub finish: String,
    /// Log-probability of each emitted token.
    #[serde(default)]
    pub logprobs: Vec<f32>,
    /// Rounds that proposed a token at each draft position.
    #[serde(default)]
    pub drafted_by_pos: Vec<usize>,
    /// Rounds whose proposal at each position was accepted.
    #[serde(default)]
    pub accepted_by_pos: Vec<usize>,
}

pub fn build_runner() -> Result<()> {
    shell::release_build()
}

/// Runs spec_run; returns provider -> results per prompt.
pub fn spec_run(run: &SpecRun<'_>) -> Result<BTreeMap<String, Vec<RunResult>>> {
    std::fs::create_dir_all(run.work)?;
    let prompts = run.work.join(format!("{}-prompts.json", run.label));
    std::fs::write(&prompts, serde_json::to_string(run.prompts)?)?;
    let out = run.work.join(format!("{}-results.json", run.label));
    let exe = shell::root()
        .join("target")
        .join("release")
        .join("examples")
        .join("spec_run");
    let mut cmd = Command::new(exe);
    cmd.arg("--model")
        .arg(run.model)
        .arg("--prompts")
        .arg(&prompts)
        .arg("--out")
        .arg(&out);
    cmd.args([
        "--max-tokens",
        &run.max_tokens.to_string(),
        "--providers",
        &run.providers.join(","),
    ]);
    for o in run.options {
        cmd.args(["--option", o]);
    }
    cmd.args(run.extra).envs(run.env.iter().copied());
    shell::run(&mut cmd)?;
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", out.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn architecture_specific_providers_run_on_their_models_only() {
        assert!(super::applies("glm52-native-mtp", "glm-q4g64"));
        assert!(!super::applies("glm52-native-mtp", "llama3"));
        assert!(!super::applies("glm52-native-mtp", crate::real_model::NAME));
        assert!(super::applies("prompt-lookup", "llama3") && super::applies("draft-model", "glm"));
    }
}
