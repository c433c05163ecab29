//! `mlx-spec generate` with a constraint (`--json-schema`, `--grammar`,
//! `--regex`), `--logprobs N` and `--logit-bias`, on the real default model.

mod common;

use common::mlx_spec;

/// The text before the first `==========`, without its trailing newline.
fn text(stdout: &str) -> &str {
    stdout
        .split("==========")
        .next()
        .unwrap_or_default()
        .trim_end_matches('\n')
}

/// One `--logprobs` line: id, log-probability, `(id, log-probability)`
/// of each alternative.
type Line = (u32, f64, Vec<(u32, f64)>);

/// The `--logprobs` lines.
fn logprob_lines(stdout: &str) -> Vec<Line> {
    let section = stdout
        .split("==========")
        .nth(1)
        .expect("a --logprobs section");
    section
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut cols = line.split('\t');
            let lp = cols
                .next()
                .expect("logprob")
                .trim()
                .parse()
                .expect("a number");
            let id = cols.next().expect("id").trim().parse().expect("an id");
            let top = line
                .split_once("\ttop: ")
                .map(|(_, top)| {
                    top.split(" | ")
                        .map(|alt| {
                            let mut words = alt.split(' ');
                            let id = words.next().expect("id").parse().expect("an id");
                            let lp = words.next().expect("lp").parse().expect("a number");
                            (id, lp)
                        })
                        .collect()
                })
                .unwrap_or_default();
            (id, lp, top)
        })
        .collect()
}

fn generate(extra: &[&str]) -> String {
    let mut args = vec!["generate", "--prompt", "Pick a number."];
    if !extra.contains(&"--max-tokens") {
        args.extend(["--max-tokens", "12"]);
    }
    args.extend(extra);
    let (ok, stdout, stderr) = mlx_spec(&args);
    assert!(ok, "{extra:?}: {stderr}");
    stdout
}

#[test]
fn a_regex_constrains_the_output_and_logprobs_list_the_alternatives() {
    let plain = generate(&["--regex", "[0-9]{3}", "--logprobs", "3"]);
    let digits = text(&plain);
    assert!(
        digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()),
        "{plain}"
    );
    let lines = logprob_lines(&plain);
    assert!(!lines.is_empty());
    for (id, lp, top) in &lines {
        assert_eq!(top.len(), 3, "{plain}");
        assert_eq!(top[0].0, *id, "greedy takes the most likely token: {plain}");
        assert!((top[0].1 - lp).abs() < 1e-3, "{plain}");
    }
    // Speculation changes nothing.
    let speculated = generate(&[
        "--regex",
        "[0-9]{3}",
        "--logprobs",
        "3",
        "--draft",
        "prompt-lookup",
    ]);
    assert_eq!(text(&speculated), digits);
}

#[test]
fn a_json_schema_file_constrains_the_output() {
    let dir = tempfile::tempdir().expect("dir");
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"answer": {"type": "integer", "maximum": 1000}},
            "required": ["answer"], "additionalProperties": false}"#,
    )
    .expect("write");
    let stdout = generate(&[
        "--json-schema",
        schema.to_str().expect("utf-8"),
        "--max-tokens",
        "24",
    ]);
    let value: serde_json::Value = serde_json::from_str(text(&stdout)).expect("JSON");
    assert!(value["answer"].is_i64(), "{stdout}");
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let free = logprob_lines(&generate(&["--logprobs"]));
    let first = free[0].0;
    let ban = format!("{first}=-100");
    let banned = logprob_lines(&generate(&["--logprobs", "--logit-bias", &ban]));
    assert!(banned.iter().all(|(id, _, _)| *id != first));
    let forced = logprob_lines(&generate(&[
        "--logprobs",
        "--logit-bias",
        r#"{"1000": 100}"#,
    ]));
    assert!(forced.len() == 12 && forced.iter().all(|(id, _, _)| *id == 1000));
}

#[test]
fn bad_constraint_flags_are_errors_naming_them() {
    for (args, names) in [
        (&["--regex", "[0-9", "--max-tokens", "1"][..], "--regex"),
        (&["--regex", "a", "--grammar", "g.lark"], "--grammar"),
        (&["--grammar", "/nonexistent/g.lark"], "/nonexistent/g.lark"),
        (
            &["--grammar", "/dev/null", "--max-tokens", "1"],
            "--grammar",
        ),
        (&["--logprobs", "21"], "--logprobs"),
        (&["--logit-bias", "5=101"], "logit_bias"),
    ] {
        let mut all = vec!["generate"];
        all.extend(args);
        let (ok, _, stderr) = mlx_spec(&all);
        assert!(!ok, "{args:?} was accepted");
        assert!(stderr.contains(names), "{args:?}: {stderr}");
    }
}
