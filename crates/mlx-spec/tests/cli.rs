//! The `mlx-spec` binary as a user runs it, on the real default model.

mod common;

use common::mlx_spec;

#[test]
fn generate_answers_with_the_default_model() {
    let (ok, stdout, stderr) = mlx_spec(&[
        "generate",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "24",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Paris"), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Prompt: ")
            && last.contains("tokens-per-sec")
            && last.contains("Peak memory"),
        "{last}"
    );
}

#[test]
fn sampled_generation_is_reproducible_with_a_seed_and_fresh_without() {
    let args = [
        "generate",
        "--prompt",
        "Tell me a story.",
        "--max-tokens",
        "12",
        "--temp",
        "0.9",
        "--top-p",
        "0.95",
        "--seed",
        "11",
    ];
    let text = |out: String| {
        out.lines()
            .take_while(|l| *l != "==========")
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (ok_a, a, err) = mlx_spec(&args);
    assert!(ok_a, "{err}");
    let (_, b, _) = mlx_spec(&args);
    assert_eq!(text(a), text(b));
    // Without `--seed` each run samples afresh, as mlx-lm's: two runs of
    // the tiny llama (a near-flat distribution over 96 words) at
    // temperature 2 agreeing on 12 tokens is all but impossible.
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(dir.path(), "{{ messages[0].content }}");
    let model = dir.path().to_str().expect("utf-8");
    let unseeded = [
        "generate", "--model", model, "--prompt", "w1 w2", "-m", "12", "--temp", "2",
    ];
    let (ok, c, err) = mlx_spec(&unseeded);
    assert!(ok, "{err}");
    let (_, d, _) = mlx_spec(&unseeded);
    assert_ne!(text(c), text(d));
}

/// As mlx-lm's `generate`: `-p -` reads the prompt from standard input, and
/// a written-out `\n` in `--prompt` is a newline, so both runs see one
/// prompt.
#[test]
fn the_prompt_comes_from_stdin_and_escapes_as_mlx_lms() {
    use std::io::Write;
    let run = |prompt: &str, stdin: Option<&str>| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
            .args(["generate", "-p", prompt, "--max-tokens", "8"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start mlx-spec");
        let mut input = child.stdin.take().expect("stdin");
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .expect("write stdin");
        drop(input);
        let out = child.wait_with_output().expect("mlx-spec");
        assert!(out.status.success(), "{}", common::text(&out.stderr));
        let stdout = common::text(&out.stdout);
        let prompt_tokens = stdout
            .lines()
            .last()
            .and_then(|l| l.split(" tokens,").next())
            .unwrap_or_default()
            .to_owned();
        let answer: Vec<String> = stdout
            .lines()
            .take_while(|l| *l != "==========")
            .map(str::to_owned)
            .collect();
        (prompt_tokens, answer)
    };
    let escaped = run("Name a colour.\\nAnswer in one word.", None);
    let piped = run("-", Some("Name a colour.\nAnswer in one word."));
    assert_eq!(escaped, piped);
}

/// mlx-lm's prompt flags: `--prefill-response` leaves the answer's start
/// in the prompt (the model continues it), `--extra-eos-token` ends the
/// answer at that token, `--verbose F` prints the answer alone (the
/// aliases are `cmd_generate`'s unit tests).
#[test]
fn mlx_lms_prompt_flags() {
    let generate = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "-p",
            "What is the capital of France?",
            "-m",
            "16",
        ];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = mlx_spec(&args);
        assert!(ok, "{extra:?}: {stderr}");
        stdout
    };
    let answer = |stdout: &str| {
        stdout
            .lines()
            .take_while(|l| *l != "==========")
            .collect::<Vec<_>>()
            .join("\n")
    };
    let prompt_tokens = |stdout: &str| -> usize {
        stdout
            .lines()
            .last()
            .and_then(|l| l.strip_prefix("Prompt: "))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{stdout}"))
    };
    let plain = generate(&[]);
    assert!(answer(&plain).contains("Paris."), "{plain}");
    let prefilled = generate(&["--prefill-response", "The answer is"]);
    assert!(
        prompt_tokens(&prefilled) > prompt_tokens(&plain),
        "{prefilled}"
    );
    assert!(
        !prefilled.starts_with("The answer is"),
        "not echoed: {prefilled}"
    );
    assert_ne!(answer(&prefilled), answer(&plain));
    let cut = generate(&["--extra-eos-token", ".", "--verbose", "F"]);
    assert!(
        !cut.contains("==========") && !cut.contains("Prompt:"),
        "alone: {cut}"
    );
    assert!(
        !cut.contains('.') && answer(&plain).starts_with(cut.trim_end()),
        "{cut}"
    );

    let (ok, _, stderr) = mlx_spec(&["generate", "--extra-eos-token", "no-such-token-xyz"]);
    assert!(!ok && stderr.contains("no-such-token-xyz"), "{stderr}");
    let (ok, _, stderr) = mlx_spec(&["generate", "--chat-template-config", "[1]"]);
    assert!(!ok && stderr.contains("--chat-template-config"), "{stderr}");
}

#[test]
fn bad_input_gives_an_error_naming_the_problem() {
    let (ok, _, stderr) = mlx_spec(&["generate", "--model", "/nonexistent/model.gguf"]);
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/model.gguf"), "{stderr}");
    let (ok, _, stderr) = mlx_spec(&["generate", "--temp=-1", "--max-tokens", "1"]);
    assert!(!ok);
    assert!(stderr.contains("temperature"), "{stderr}");
}

/// The penalties change the greedy answer, speculation keeps it, and an
/// XTC threshold past mlx-lm's range is named.
#[test]
fn penalties_apply_and_speculation_keeps_them() {
    let answer = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--prompt",
            "What is the capital of France?",
            "--max-tokens",
            "16",
            "--verbose",
            "f",
        ];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = mlx_spec(&args);
        assert!(ok, "{extra:?}: {stderr}");
        stdout
    };
    let plain = answer(&[]);
    let penalised = [
        "--frequency-penalty",
        "1.5",
        "--frequency-context-size",
        "0",
    ];
    let changed = answer(&penalised);
    assert_ne!(
        changed, plain,
        "the penalty over the whole history must matter"
    );
    let drafted = answer(&[&penalised[..], &["--draft", "prompt-lookup"]].concat());
    assert_eq!(drafted, changed);
    let (ok, _, stderr) = mlx_spec(&[
        "generate",
        "--xtc-threshold",
        "0.7",
        "--temp",
        "1",
        "-m",
        "1",
    ]);
    assert!(!ok);
    assert!(stderr.contains("xtc_threshold"), "{stderr}");
}

/// mlx-lm's `--log-level` on every command: `INFO` shows the load,
/// `WARNING` does not, an unknown level is named.
#[test]
fn log_level_as_mlx_lms() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(dir.path(), "{{ messages[0].content }}");
    let model = dir.path().to_str().expect("utf-8");
    let args = [
        "generate",
        "--model",
        model,
        "-p",
        "w1",
        "-m",
        "1",
        "--verbose",
        "f",
    ];
    let (ok, _, quiet) = mlx_spec(&[&args[..], &["--log-level", "WARNING"]].concat());
    assert!(ok, "{quiet}");
    assert!(!quiet.contains("model loaded"), "{quiet}");
    let (ok, _, told) = mlx_spec(&[&args[..], &["--log-level", "INFO"]].concat());
    assert!(ok, "{told}");
    assert!(told.contains("model loaded"), "{told}");
    let (ok, _, stderr) = mlx_spec(&["--log-level", "loud", "providers"]);
    assert!(!ok);
    assert!(stderr.contains("is no log level"), "{stderr}");
}

#[test]
fn stop_strings_end_the_output_before_them() {
    let (ok, stdout, stderr) = mlx_spec(&[
        "generate",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "24",
        "--stop",
        "Paris",
    ]);
    assert!(ok, "{stderr}");
    let text = stdout.split("==========").next().unwrap_or_default();
    assert!(
        !text.contains("Paris") && text.contains("capital"),
        "{stdout}"
    );
}

#[test]
fn providers_are_listed_and_speculation_reports_its_stats() {
    let (ok, stdout, stderr) = mlx_spec(&["providers"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("prompt-lookup") && stdout.contains("draft-model"),
        "{stdout}"
    );
    let prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog.";
    let (ok, plain, stderr) = mlx_spec(&["generate", "--prompt", prompt, "--max-tokens", "30"]);
    assert!(ok, "{stderr}");
    let (ok, spec, stderr) = mlx_spec(&[
        "generate",
        "--prompt",
        prompt,
        "--max-tokens",
        "30",
        "--draft",
        "prompt-lookup",
        "--num-draft",
        "4",
    ]);
    assert!(ok, "{stderr}");
    let text = |s: &str| s.split("==========").next().unwrap_or_default().to_owned();
    assert_eq!(text(&plain), text(&spec), "speculation changed the output");
    let last = spec.lines().last().unwrap_or_default();
    assert!(
        last.contains("acceptance") && last.contains("tokens per target forward"),
        "{last}"
    );
    let (ok, _, stderr) = mlx_spec(&["generate", "--draft", "no-such", "--max-tokens", "1"]);
    assert!(
        !ok && stderr.contains("no-such") && stderr.contains("prompt-lookup"),
        "{stderr}"
    );
}

#[test]
fn prompt_lookup_drafts_long_windows_when_the_answer_copies_the_prompt() {
    let prompt = "Change the log level to debug in this config file. Reply with the whole file only.\n```yaml\nserver:\n  host: 127.0.0.1\n  port: 8080\n  workers: 4\ndatabase:\n  url: postgres://localhost/app\n  pool_size: 10\nlogging:\n  level: info\n```";
    let (ok, plain, stderr) = mlx_spec(&["generate", "--prompt", prompt, "--max-tokens", "60"]);
    assert!(ok, "{stderr}");
    // No --num-draft: the provider's own default (16) and the doubling controller.
    let (ok, spec, stderr) = mlx_spec(&[
        "generate",
        "--prompt",
        prompt,
        "--max-tokens",
        "60",
        "--draft",
        "prompt-lookup",
    ]);
    assert!(ok, "{stderr}");
    let text = |s: &str| s.split("==========").next().unwrap_or_default().to_owned();
    assert_eq!(text(&plain), text(&spec), "speculation changed the output");
    let last = spec.lines().last().unwrap_or_default();
    let per_forward: f64 = last
        .rsplit("tokens per target forward ")
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no tokens per target forward in {last}"));
    // Three drafts a round could never pass 4 tokens per forward.
    assert!(per_forward > 4.0, "{last}");
}

/// The answer (the text before mlx-lm's `==========`) to a prompt asking to
/// repeat a sentence, `max_tokens` tokens at most, with `extra` flags.
fn repeated_fox(max_tokens: usize, extra: &[&str]) -> String {
    let prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog.";
    let max = max_tokens.to_string();
    let mut args = vec!["generate", "--prompt", prompt, "--max-tokens", &max];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = mlx_spec(&args);
    assert!(ok, "{stderr}");
    stdout
        .split("==========")
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// `--kv-bits`: below mlx-lm's default `--quantized-kv-start` (5000) a
/// short prompt's answer reads float keys (the float answer); from the
/// first position, speculation leaves the quantized answer as it is;
/// out-of-range values name their flags before a model loads.
#[test]
fn kv_bits_keep_speculation_exact_and_bad_values_are_named() {
    let run = |extra: &[&str]| repeated_fox(24, extra);
    assert_eq!(
        run(&["--kv-bits", "4"]),
        run(&[]),
        "before the start: float keys"
    );
    let from_first = ["--kv-bits", "4", "--quantized-kv-start", "0"];
    let plain = run(&from_first);
    assert!(plain.contains("quick brown fox"), "{plain}");
    let lookup = ["--draft", "prompt-lookup", "--num-draft", "4"];
    let spec = run(&[&from_first[..], &lookup[..]].concat());
    assert_eq!(
        plain, spec,
        "speculation changed the quantized-cache output"
    );
    for (args, named) in [
        (&["--kv-bits", "7"][..], "--kv-bits 7"),
        (
            &["--kv-bits", "4", "--kv-group-size", "48"][..],
            "--kv-group-size 48",
        ),
        (&["--kv-group-size", "32"][..], "--kv-bits"),
        (&["--quantized-kv-start", "0"][..], "--kv-bits"),
    ] {
        let mut all = vec!["generate", "--max-tokens", "1"];
        all.extend_from_slice(args);
        let (ok, _, stderr) = mlx_spec(&all);
        assert!(!ok && stderr.contains(named), "{args:?}: {stderr}");
    }
}

/// `--max-kv-size`: with the caches bounded to 24 positions (the chat
/// template alone is longer), prompt lookup's answer is plain decoding's
/// under the same bound; a bound that leaves nothing past the 4 kept
/// positions, and one with `--kv-bits`, name the flag.
#[test]
fn max_kv_size_keeps_speculation_exact_and_bad_values_are_named() {
    let run = |extra: &[&str]| repeated_fox(32, extra);
    let bounded = ["--max-kv-size", "24"];
    let plain = run(&bounded);
    let lookup = ["--draft", "prompt-lookup", "--num-draft", "6"];
    assert_eq!(
        run(&[&bounded[..], &lookup[..]].concat()),
        plain,
        "speculation changed the bounded output"
    );
    for (args, named) in [
        (&["--max-kv-size", "4"][..], "at least 5"),
        (&["--max-kv-size", "64", "--kv-bits", "4"][..], "--kv-bits"),
    ] {
        let mut all = vec!["generate", "--max-tokens", "1"];
        all.extend_from_slice(args);
        let (ok, _, stderr) = mlx_spec(&all);
        assert!(
            !ok && stderr.contains("--max-kv-size") && stderr.contains(named),
            "{args:?}: {stderr}"
        );
    }
}

/// `--prediction-file` (OpenAI's predicted outputs on the command line):
/// prompt lookup drafts from the file, chosen without `--draft`; the answer
/// is the plain one, most of it drafted from the prediction; a missing
/// file is an error naming the flag.
#[test]
fn a_prediction_file_is_drafted_from_and_changes_no_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("tiny");
    std::fs::create_dir(&model).expect("mkdir");
    common::tiny_llama_with_template(&model, "{{ messages[0].content }}");
    let model = model.to_str().expect("utf-8");
    let ask = [
        "generate", "--model", model, "--prompt", "w3 w4 w5", "-m", "40",
    ];
    let (ok, plain, err) = mlx_spec(&ask);
    assert!(ok, "{err}");
    let answer = plain.lines().next().expect("the answer").to_owned();
    let file = dir.path().join("predicted.txt");
    std::fs::write(&file, &answer).expect("write");
    let file = file.to_str().expect("utf-8");
    let (ok, predicted, err) = mlx_spec(&[&ask[..], &["--prediction-file", file]].concat());
    assert!(ok, "{err}");
    assert_eq!(predicted.lines().next(), Some(answer.as_str()));
    let per_forward = |out: &str| -> f64 {
        out.split("tokens per target forward ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no prompt lookup stats: {out}"))
    };
    let (ok, lookup, err) = mlx_spec(&[&ask[..], &["--draft", "prompt-lookup"]].concat());
    assert!(ok, "{err}");
    assert!(
        per_forward(&predicted) >= 3.0 && per_forward(&lookup) < 2.0,
        "{predicted}\n{lookup}"
    );
    let (ok, _, err) = mlx_spec(&[&ask[..], &["--prediction-file", "/nonexistent/p.txt"]].concat());
    assert!(!ok && err.contains("--prediction-file"), "{err}");
}

/// A special token the model writes mid-answer is printed, as mlx-lm's
/// detokenizers print it (gpt-oss's harmony markers, Gemma 4's channel):
/// a tiny llama's answer, then the same answer with the word it writes
/// first made a special token of its vocabulary.
#[test]
fn special_tokens_the_model_writes_are_printed() {
    let dir = tempfile::tempdir().expect("tempdir");
    spec_fixtures::llama::Llama::tiny(4)
        .write(dir.path())
        .expect("checkpoint");
    common::write_tokenizer(dir.path(), 96);
    let model = dir.path().to_str().expect("utf-8 path");
    let args = [
        "generate",
        "--model",
        model,
        "--prompt",
        "w1 w2 w3",
        "--no-chat-template",
        "--max-tokens",
        "8",
    ];
    let text = |stdout: &str| stdout.split("\n==========").next().map(str::to_owned);
    let (ok, plain, stderr) = mlx_spec(&args);
    assert!(ok, "{stderr}");
    let plain = text(&plain).expect("text");
    let first = plain.split_whitespace().next().expect("a word").to_owned();
    let id: u64 = first[1..].parse().expect("a word of the vocabulary");
    let path = dir.path().join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    tokenizer["added_tokens"] = serde_json::json!([{"id": id, "content": first, "single_word": false,
        "lstrip": false, "rstrip": false, "normalized": false, "special": true}]);
    std::fs::write(&path, tokenizer.to_string()).expect("write");
    let (ok, special, stderr) = mlx_spec(&args);
    assert!(ok, "{stderr}");
    let special = text(&special).expect("text");
    assert!(
        special.starts_with(&first),
        "{first} kept: {special:?} / {plain:?}"
    );
    assert_eq!(
        special.split_whitespace().collect::<Vec<_>>(),
        plain.split_whitespace().collect::<Vec<_>>(),
        "the same words"
    );
}
