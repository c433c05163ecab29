//! Gate `gguf`'s tokenizer check: llama.cpp's vocabulary tests. llama.cpp
//! keeps vocabulary-only GGUF files of many families (`models/ggml-vocab-*.gguf`,
//! as its converter writes them) with texts (`.inp`) and the ids Hugging
//! Face's tokenizer of the same family gives them (`.out`, written by its
//! `convert_hf_to_gguf_update.py` with `add_special_tokens=False`), from
//! the llama.cpp copy `llama_cpp.rs` unpacks. Our tokenizer built from each file's
//! metadata (`spec-text` example `gguf_vocab`) must give those ids on every
//! text, for each family we support; every other family's file must be
//! refused by name, never tokenized some other way.

use std::path::Path;

use anyhow::{bail, Context, Result};
use run_protocol::gguf::{GgufVocabRequest, VocabCase, VocabResult};

use super::{compare, llama_cpp, Counts};
use crate::{runs, shell, venv};

/// Encodes texts with transformers from the tokenizer files we write.
const HF_IDS: &str = "xtask/python/hf_tokenizer_ids.py";

/// The families (`ggml-vocab-NAME.gguf`) whose tokenizer we build; the
/// others there must be refused.
const SUPPORTED: &[&str] = &[
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// Separates the texts of a `.inp` file.
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

pub fn run(work: &Path) -> Result<Counts> {
    let models = llama_cpp::ensure()?.join("models");
    let mut names: Vec<String> = std::fs::read_dir(&models)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let family = name.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf")?;
            models
                .join(format!("{name}.inp"))
                .exists()
                .then(|| family.to_owned())
        })
        .collect();
    names.sort();
    for family in SUPPORTED {
        if !names.iter().any(|n| n == family) {
            bail!("{} has no test files for `{family}`", models.display());
        }
    }
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    for family in &names {
        let file = models.join(format!("ggml-vocab-{family}.gguf"));
        let inp = std::fs::read_to_string(file.with_extension("gguf.inp"))?;
        // Each text is followed by the separator, but one file's last is not.
        let mut texts: Vec<String> = inp.split(SEPARATOR).map(str::to_owned).collect();
        if texts.last().is_some_and(String::is_empty) {
            texts.pop();
        }
        let out = std::fs::read_to_string(file.with_extension("gguf.out"))?;
        let ids = out
            .lines()
            .map(|line| {
                line.split_whitespace()
                    .map(str::parse)
                    .collect::<Result<Vec<u32>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("reading {}.out", file.display()))?;
        if ids.len() != texts.len() {
            bail!(
                "{}: {} texts but {} id lines",
                file.display(),
                texts.len(),
                ids.len()
            );
        }
        let hf_dir = SUPPORTED
            .contains(&family.as_str())
            .then(|| work.join("hf").join(family));
        cases.push(VocabCase {
            file,
            texts,
            hf_dir,
        });
        expected.push(ids);
    }
    shell::build()?;
    let request = GgufVocabRequest { cases };
    let report = runs::example(&request, &work.join("vocab"), &[])?;
    let cases = request.cases;
    if report.cases.len() != cases.len() {
        bail!(
            "gguf_vocab answered {} cases of {}",
            report.cases.len(),
            cases.len()
        );
    }
    let exported = exported_ids(&cases, &report.cases, work)?;
    println!("\ngguf: tokenizers from llama.cpp's vocabulary files against Hugging Face's ids");
    let mut counts = Counts::default();
    for ((((family, case), want), got), hf) in names
        .iter()
        .zip(&cases)
        .zip(&expected)
        .zip(&report.cases)
        .zip(&exported)
    {
        let supported = SUPPORTED.contains(&family.as_str());
        let verdict = match (&got.error, supported) {
            (Some(e), true) => format!("FAIL  not built: {e}"),
            (Some(e), false) if e.contains("unsupported") => {
                let why = &e[e.find("unsupported").unwrap_or(0)..];
                format!(
                    "ok    refused: {}",
                    why.split(" (supported").next().unwrap_or(why)
                )
            }
            (Some(e), false) => format!("FAIL  refused without naming why: {e}"),
            (None, false) => "FAIL  built, but this family is not one we reproduce".to_owned(),
            (None, true) => match want.iter().zip(&got.ids).position(|(w, g)| w != g) {
                _ if got.ids.len() != want.len() => {
                    format!("FAIL  {} results for {} texts", got.ids.len(), want.len())
                }
                None => match round_trip(&case.texts, got) {
                    Some(problem) => format!("FAIL  the same ids, but {problem}"),
                    None if hf.as_ref() != Some(want) => {
                        let i = hf.as_ref().and_then(|hf| compare::first_difference(hf, want));
                        format!("FAIL  the same ids, but our tokenizer.json in transformers differs (text {i:?})")
                    }
                    None => format!(
                        "ok    {} texts, the same ids, decoded back whole and streamed; the same from our tokenizer.json in transformers",
                        want.len()
                    ),
                },
                Some(i) => format!(
                    "FAIL  text {i} ({:?}): ours {:?}, Hugging Face {:?}",
                    case.texts[i], got.ids[i], want[i]
                ),
            },
        };
        counts.count(verdict.starts_with("ok"));
        println!("  {family:<16} {verdict}");
    }
    Ok(counts)
}

/// Where decoding the ids does not give the text back (whole, or joined
/// from the streaming decoder's pieces): the test texts are all NFC, which
/// the one normalizing family (Qwen2) keeps.
fn round_trip(texts: &[String], got: &VocabResult) -> Option<String> {
    if got.decoded.len() != texts.len() || got.streamed.len() != texts.len() {
        return Some(format!(
            "{} decoded and {} streamed for {} texts",
            got.decoded.len(),
            got.streamed.len(),
            texts.len()
        ));
    }
    let decoded = texts.iter().zip(&got.decoded).zip(&got.streamed);
    for (i, ((text, whole), streamed)) in decoded.enumerate() {
        if whole != text {
            return Some(format!("text {i} ({text:?}) decodes to {whole:?}"));
        }
        if streamed != text {
            return Some(format!("text {i} ({text:?}) streams as {streamed:?}"));
        }
    }
    None
}

/// The ids transformers gives each text from the tokenizer files our
/// example wrote (`xtask/python/hf_tokenizer_ids.py`), per case; `None`
/// where none were written.
fn exported_ids(
    cases: &[VocabCase],
    results: &[VocabResult],
    work: &Path,
) -> Result<Vec<Option<Vec<Vec<u32>>>>> {
    let written: Vec<(usize, &VocabCase)> = cases
        .iter()
        .enumerate()
        .filter(|(i, c)| c.hf_dir.is_some() && results[*i].error.is_none())
        .collect();
    let jobs = serde_json::json!({
        "cases": written
            .iter()
            .map(|(_, c)| serde_json::json!({"dir": c.hf_dir, "texts": c.texts}))
            .collect::<Vec<_>>(),
    });
    let (jobs_path, out_path) = (work.join("hf-jobs.json"), work.join("hf-ids.json"));
    std::fs::write(&jobs_path, jobs.to_string())?;
    let python = venv::ensure()?;
    shell::run(
        venv::python_command(&python)
            .arg(shell::root().join(HF_IDS))
            .arg(&jobs_path)
            .arg(&out_path),
    )
    .context("transformers on our tokenizer files failed")?;
    let out: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out_path)?)?;
    let answered: Vec<Vec<Vec<u32>>> = serde_json::from_value(out["cases"].clone())
        .with_context(|| format!("reading {}", out_path.display()))?;
    let mut ids = vec![None; cases.len()];
    for ((i, _), answer) in written.iter().zip(answered) {
        ids[*i] = Some(answer);
    }
    Ok(ids)
}
