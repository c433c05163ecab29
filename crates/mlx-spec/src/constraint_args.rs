//! `generate`'s flags that shape what may be sampled: a constraint
//! (`--json-schema FILE`, `--grammar FILE`, `--regex R`, one at most) and
//! `--logit-bias`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use spec_core::LogitBias;
use spec_text::Tokenizer;

use crate::grammar::GrammarSpec;

#[derive(clap::Args, Debug, Default)]
pub struct ConstraintArgs {
    /// Constrain the output to JSON valid against this JSON Schema file,
    /// laid out as Python's json.dumps writes it (", " and ": ", no other
    /// whitespace; separators and keys are then forced); a schema with its
    /// own "x-guidance" object keeps that layout, e.g.
    /// {"whitespace_flexible": true} lets the model choose whitespace.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["grammar", "regex"])]
    json_schema: Option<PathBuf>,
    /// Constrain the output to this Lark grammar file (llguidance's syntax).
    #[arg(long, value_name = "FILE", conflicts_with = "regex")]
    grammar: Option<PathBuf>,
    /// Constrain the output to match this regular expression.
    #[arg(long, value_name = "REGEX")]
    regex: Option<String>,
    /// Add BIAS (-100 to 100) to token ID's logit before sampling, as
    /// OpenAI's `logit_bias`; repeatable, or a JSON object `{"ID": BIAS}`.
    #[arg(long = "logit-bias", value_name = "ID=BIAS")]
    logit_bias: Vec<String>,
}

impl ConstraintArgs {
    /// The flag that asked for a constraint.
    pub fn flag(&self) -> Option<&'static str> {
        if self.json_schema.is_some() {
            Some("--json-schema")
        } else if self.grammar.is_some() {
            Some("--grammar")
        } else if self.regex.is_some() {
            Some("--regex")
        } else {
            None
        }
    }

    /// The constraint asked for, its file read (and a schema parsed).
    pub fn grammar(&self) -> Result<Option<GrammarSpec>> {
        if let Some(path) = &self.json_schema {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--json-schema {}", path.display()))?;
            let schema: Value = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema {}: not JSON", path.display()))?;
            if !schema.is_object() && !schema.is_boolean() {
                bail!(
                    "--json-schema {}: a JSON Schema is an object",
                    path.display()
                );
            }
            return Ok(Some(GrammarSpec::JsonSchema(schema)));
        }
        if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--grammar {}", path.display()))?;
            return Ok(Some(GrammarSpec::Lark(text)));
        }
        Ok(self.regex.clone().map(GrammarSpec::Regex))
    }

    /// `spec` (from [`ConstraintArgs::grammar`]) compiled for a model
    /// whose logits are `vocab` wide; `None` without one.
    pub fn compile(
        &self,
        spec: Option<&GrammarSpec>,
        tokenizer: &Arc<Tokenizer>,
        vocab: usize,
    ) -> Result<Option<Box<dyn spec_core::Constraint>>> {
        let Some(spec) = spec else {
            return Ok(None);
        };
        let flag = self.flag().unwrap_or("the constraint");
        let env = crate::grammar::token_env(tokenizer, vocab).map_err(|reason| {
            anyhow::anyhow!("{flag}: this model has no constrained decoding ({reason})")
        })?;
        let constraint = crate::grammar::compile(&env, spec).with_context(|| flag.to_owned())?;
        Ok(Some(constraint))
    }

    /// The `--logit-bias` entries, `(id, bias)`.
    fn bias_entries(&self) -> Result<Vec<(u32, f32)>> {
        let mut entries = Vec::new();
        for arg in &self.logit_bias {
            if arg.trim_start().starts_with('{') {
                let map: serde_json::Map<String, Value> = serde_json::from_str(arg)
                    .with_context(|| format!("--logit-bias {arg}: not a JSON object"))?;
                for (id, bias) in map {
                    let bias = bias.as_f64().with_context(|| {
                        format!("--logit-bias: the bias of `{id}` is no number")
                    })?;
                    entries.push((parse_id(&id)?, bias as f32));
                }
            } else {
                let (id, bias) = arg
                    .split_once('=')
                    .with_context(|| format!("--logit-bias `{arg}`: expected ID=BIAS"))?;
                let bias: f32 = bias
                    .trim()
                    .parse()
                    .with_context(|| format!("--logit-bias `{arg}`: the bias is no number"))?;
                entries.push((parse_id(id.trim())?, bias));
            }
        }
        Ok(entries)
    }

    /// The logit bias for a vocabulary of `vocab` ids (`None`: no flag).
    pub fn logit_bias(&self, vocab: usize) -> Result<Option<LogitBias>> {
        let entries = self.bias_entries()?;
        if entries.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            LogitBias::new(&entries, vocab).context("--logit-bias")?,
        ))
    }
}

fn parse_id(id: &str) -> Result<u32> {
    id.parse()
        .with_context(|| format!("--logit-bias: `{id}` is not a token id"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ConstraintArgs,
    }

    fn parse(args: &[&str]) -> Result<ConstraintArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("generate").chain(args.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn one_constraint_at_most() {
        for pair in [
            &["--json-schema", "a.json", "--regex", "x"][..],
            &["--json-schema", "a.json", "--grammar", "g.lark"],
            &["--grammar", "g.lark", "--regex", "x"],
        ] {
            assert!(parse(pair).is_err(), "{pair:?}");
        }
        let regex = parse(&["--regex", "[0-9]+"]).expect("one");
        assert_eq!(regex.flag(), Some("--regex"));
        assert_eq!(
            regex.grammar().expect("regex"),
            Some(GrammarSpec::Regex("[0-9]+".into()))
        );
        assert_eq!(parse(&[]).expect("none").grammar().expect("none"), None);
    }

    #[test]
    fn a_schema_file_is_read_and_parsed() {
        let dir = tempfile::tempdir().expect("dir");
        let good = dir.path().join("s.json");
        std::fs::write(&good, r#"{"type": "object"}"#).expect("write");
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{type").expect("write");
        let arg = |p: &std::path::Path| {
            parse(&["--json-schema", p.to_str().expect("utf-8")]).expect("parse")
        };
        assert_eq!(
            arg(&good).grammar().expect("schema"),
            Some(GrammarSpec::JsonSchema(
                serde_json::json!({"type": "object"})
            ))
        );
        let err = arg(&bad).grammar().expect_err("not JSON");
        assert!(format!("{err:#}").contains("not JSON"), "{err:#}");
        assert!(arg(&dir.path().join("missing.json")).grammar().is_err());
    }

    #[test]
    fn logit_bias_as_pairs_or_a_json_object() {
        let args = parse(&[
            "--logit-bias",
            "5=-100",
            "--logit-bias",
            r#"{"7": 2.5, "1": 100}"#,
        ])
        .expect("parse");
        let mut entries = args.bias_entries().expect("entries");
        entries.sort_by_key(|&(id, _)| id);
        assert_eq!(entries, [(1, 100.0), (5, -100.0), (7, 2.5)]);
        assert!(args.logit_bias(10).expect("valid").is_some());
        assert!(args.logit_bias(6).is_err(), "7 is past a vocabulary of 6");
        for bad in ["5", "x=1", "5=lots", "5=101", r#"{"5": "1"}"#] {
            let args = parse(&["--logit-bias", bad]).expect("parse");
            assert!(args.logit_bias(10).is_err(), "{bad}");
        }
        assert!(parse(&[])
            .expect("none")
            .logit_bias(10)
            .expect("none")
            .is_none());
    }
}
