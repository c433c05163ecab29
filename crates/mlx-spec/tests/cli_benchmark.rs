//! `mlx-spec benchmark` as a user runs it, on the tiny llama.

mod common;

use common::mlx_spec;

/// The numbers a line gives as `name=value`.
fn values(line: &str) -> Vec<(String, f64)> {
    line.split([',', ' '])
        .filter_map(|part| part.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.parse().expect("a number")))
        .collect()
}

#[test]
fn trials_time_plain_and_speculated_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(dir.path(), "{{ messages[0].content }} w2");
    let model = dir.path().to_str().expect("utf-8");
    let (ok, out, err) = mlx_spec(&[
        "benchmark",
        "--model",
        model,
        "-p",
        "16",
        "-g",
        "8",
        "-n",
        "2",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "Running warmup..", "{out}");
    assert_eq!(
        lines[1], "Timing with prompt_tokens=16, generation_tokens=8, batch_size=1.",
        "{out}"
    );
    for (line, prefix) in lines[2..]
        .iter()
        .zip(["Trial 1:  ", "Trial 2:  ", "Averages: "])
    {
        assert!(line.starts_with(prefix), "{out}");
        let named = values(line);
        let names: Vec<&str> = named.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names[..3],
            ["prompt_tps", "generation_tps", "peak_memory"],
            "{line}"
        );
        assert!(named[..2].iter().all(|(_, v)| *v > 0.0), "{line}");
    }
    assert_eq!(lines.len(), 5, "{out}");

    // A batch of 3 copies of a prompt that repeats itself, plain and with
    // prompt lookup: speculation drafts, accepts, and every token is plain's.
    let prompt = dir.path().join("prompt.txt");
    std::fs::write(&prompt, "w5 w6 w7 w8 w5 w6 w7 w8 w5 w6 w7 w8").expect("write");
    let (ok, out, err) = mlx_spec(&[
        "benchmark",
        "--model",
        model,
        "--prompt-file",
        prompt.to_str().expect("utf-8"),
        "-g",
        "96",
        "-n",
        "1",
        "-b",
        "3",
        "--draft",
        "prompt-lookup",
        // The goodput policy sizes drafts by measured step times: on a
        // loaded machine it may draft nothing in so short a run. Each
        // row's own controller depends on acceptance alone.
        "--draft-policy",
        "per-row",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("prompt_tokens=13, generation_tokens=96, batch_size=3."),
        "{out}"
    );
    let drafted = out
        .lines()
        .find(|l| l.starts_with("Trial 1 prompt-lookup:  "))
        .expect("the speculated trial");
    let tokens_per_forward = values(drafted)
        .into_iter()
        .find(|(k, _)| k == "tokens_per_forward")
        .map(|(_, v)| v)
        .expect("tokens per forward");
    assert!(tokens_per_forward > 1.0, "{drafted}");
    assert!(
        out.contains("Trial 1 plain:  ") && out.contains("Averages plain: "),
        "{out}"
    );
    assert!(out.contains("every trial's tokens equal plain's"), "{out}");
}

#[test]
fn bad_input_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::tiny_llama_with_template(dir.path(), "{{ messages[0].content }}");
    let model = dir.path().to_str().expect("utf-8");
    for (flags, named) in [
        (&["-n", "0"][..], "--num-trials"),
        (&["-g", "0"], "--generation-tokens"),
        (&["-b", "0"], "--batch-size"),
        (&["-p", "0"], "--prompt-tokens"),
        (
            &["--prompt-file", "/nonexistent/p.txt"],
            "/nonexistent/p.txt",
        ),
        (&["--draft", "no-such"], "no-such"),
        (&["-p", "4", "--prompt-file", "x"], "--prompt-file"),
    ] {
        let mut args = vec!["benchmark", "--model", model, "-g", "2", "-n", "1"];
        args.extend_from_slice(flags);
        let (ok, _, err) = mlx_spec(&args);
        assert!(!ok && err.contains(named), "{flags:?}: {err}");
    }
}
