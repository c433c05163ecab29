//! `mlx-spec perplexity` as a user runs it, on the tiny llama (its equality
//! with `mlx_lm.perplexity` is the `perplexity` gate's).

mod common;

use common::mlx_spec;

#[test]
fn scores_rows_of_each_format_and_names_bad_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(
        dir.path(),
        "{% for m in messages %}w1 {{ m.content }} {% endfor %}",
    );
    // mlx-lm's text records end with the tokenizer's end-of-sequence token.
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::json!({
            "chat_template": "{% for m in messages %}w1 {{ m.content }} {% endfor %}",
            "eos_token": "w2",
        })
        .to_string(),
    )
    .expect("tokenizer_config.json");
    let model = dir.path().to_str().expect("utf-8");
    let write = |name: &str, lines: &[&str]| {
        let path = dir.path().join(name);
        std::fs::write(&path, lines.join("\n")).expect("write");
        path.to_str().expect("utf-8").to_owned()
    };
    let words = |i: usize| {
        (0..10)
            .map(|k| format!("w{}", 3 + (i * 7 + k) % 90))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let text: Vec<String> = (0..8)
        .map(|i| serde_json::json!({"text": words(i)}).to_string())
        .collect();
    let text = write(
        "text.jsonl",
        &text.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // A directory holding train.jsonl is read as mlx-lm reads one.
    let chat_dir = dir.path().join("chat");
    std::fs::create_dir(&chat_dir).expect("mkdir");
    let chat: Vec<String> = (0..8)
        .map(|i| {
            serde_json::json!({"messages": [
                {"role": "user", "content": words(i)},
                {"role": "assistant", "content": words(i + 1)},
            ]})
            .to_string()
        })
        .collect();
    std::fs::write(chat_dir.join("train.jsonl"), chat.join("\n")).expect("write");
    let run = |data: &str, extra: &[&str]| {
        let mut args = vec![
            "perplexity",
            "--model",
            model,
            "--data-path",
            data,
            "--sequence-length",
            "16",
        ];
        args.extend_from_slice(extra);
        mlx_spec(&args)
    };
    for data in [text.as_str(), chat_dir.to_str().expect("utf-8")] {
        let (ok, out, err) = run(data, &["--num-samples", "-1", "--batch-size", "3"]);
        assert!(ok, "{err}");
        let ppl: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("Perplexity: "))
            .and_then(|l| l.split(' ').next())
            .expect("a perplexity line")
            .parse()
            .expect("a number");
        // A random model over 96 words: about the vocabulary's size.
        assert!(ppl.is_finite() && ppl > 1.0, "{out}");
        assert!(out.contains("  Total tokens: "), "{out}");
    }
    // 8 records of 11 tokens (an end token each): 88 tokens, 5 rows of 16.
    let (ok, out, err) = run(&text, &["--num-samples", "-1"]);
    assert!(ok && out.contains("Loaded 5 samples"), "{out}{err}");
    let (ok, out, err) = run(&text, &["--num-samples", "2"]);
    assert!(ok && out.contains("Loaded 2 samples"), "{out}{err}");

    let bad_json = write("bad.jsonl", &[r#"{"text": "w1"}"#, "{oops"]);
    let unknown = write("unknown.jsonl", &[r#"{"body": "w1"}"#]);
    let empty = write("empty.jsonl", &[]);
    let short = write("short.jsonl", &[r#"{"text": "w1 w2"}"#]);
    let missing = dir.path().join("none.jsonl");
    let missing = missing.to_str().expect("utf-8");
    for (data, extra, named) in [
        (bad_json.as_str(), &[][..], "line 2"),
        (unknown.as_str(), &[], "`text`, `messages`"),
        (empty.as_str(), &[], "no records"),
        (short.as_str(), &[], "fewer than 16 tokens"),
        (missing, &[], "none.jsonl"),
        (text.as_str(), &["--num-samples", "0"], "--num-samples"),
        (text.as_str(), &["--batch-size", "0"], "--batch-size"),
        (
            text.as_str(),
            &["--sequence-length", "1"],
            "--sequence-length",
        ),
    ] {
        let (ok, _, err) = run(data, extra);
        assert!(!ok && err.contains(named), "{named}: {err}");
    }
    // Chat records need a template.
    let bare = tempfile::tempdir().expect("tempdir");
    spec_fixtures::llama::Llama::tiny(7)
        .write(bare.path())
        .expect("checkpoint");
    common::write_tokenizer(bare.path(), 96);
    let (ok, _, err) = mlx_spec(&[
        "perplexity",
        "--model",
        bare.path().to_str().expect("utf-8"),
        "--data-path",
        chat_dir.to_str().expect("utf-8"),
    ]);
    assert!(!ok && err.contains("chat template"), "{err}");
    // Text records need an end-of-sequence token.
    let (ok, _, err) = mlx_spec(&[
        "perplexity",
        "--model",
        bare.path().to_str().expect("utf-8"),
        "--data-path",
        &text,
    ]);
    assert!(!ok && err.contains("end-of-sequence"), "{err}");
}
