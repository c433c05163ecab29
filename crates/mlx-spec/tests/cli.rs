//! The `mlx-spec` binary as a user runs it, on the real default model.

use std::process::Command;

fn mlx_spec(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-spec")).args(args).output().expect("run mlx-spec");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn generate_answers_with_the_default_model() {
    let (ok, stdout, stderr) = mlx_spec(&["generate", "--prompt", "What is the capital of France?", "--max-tokens", "24"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Paris"), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("Prompt: ") && last.contains("tokens-per-sec") && last.contains("Peak memory"), "{last}");
}

#[test]
fn sampled_generation_is_reproducible_with_a_seed() {
    let args = ["generate", "--prompt", "Tell me a story.", "--max-tokens", "12", "--temp", "0.9", "--top-p", "0.95", "--seed", "11"];
    let text = |out: String| out.lines().take_while(|l| *l != "==========").collect::<Vec<_>>().join("\n");
    let (ok_a, a, err) = mlx_spec(&args);
    assert!(ok_a, "{err}");
    let (_, b, _) = mlx_spec(&args);
    assert_eq!(text(a), text(b));
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
