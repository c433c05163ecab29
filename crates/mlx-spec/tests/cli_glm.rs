//! `mlx-spec generate --draft glm52-native-mtp` on a tiny GLM checkpoint
//! (random weights, a word-level tokenizer of its 96 ids).

mod common;

use common::{mlx_spec, write_tokenizer};

use spec_fixtures::glm::Glm as TinyGlm;

#[test]
fn generate_speculates_with_the_native_mtp_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    TinyGlm::default().write(dir.path()).expect("checkpoint");
    write_tokenizer(dir.path(), 96);
    let model = dir.path().to_str().expect("utf-8 path");
    let base = [
        "generate",
        "--model",
        model,
        "--prompt",
        "w5 w6 w7 w8",
        "--no-chat-template",
        "--max-tokens",
        "24",
    ];
    let (ok, plain, stderr) = mlx_spec(&base);
    assert!(ok, "{stderr}");
    let mut args = base.to_vec();
    args.extend(["--draft", "glm52-native-mtp", "--no-adaptive"]);
    let (ok, spec, stderr) = mlx_spec(&args);
    assert!(ok, "{stderr}");
    let text = |s: &str| s.split("==========").next().unwrap_or_default().to_owned();
    assert_eq!(text(&plain), text(&spec), "speculation changed the output");
    assert!(!text(&spec).trim().is_empty());
    let last = spec.lines().last().unwrap_or_default();
    assert!(
        last.contains("Draft glm52-native-mtp: acceptance"),
        "{last}"
    );
}

#[test]
fn the_native_mtp_provider_refuses_other_models_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    TinyGlm {
        mtp_rows: 0,
        ..TinyGlm::default()
    }
    .write(dir.path())
    .expect("checkpoint");
    write_tokenizer(dir.path(), 96);
    let model = dir.path().to_str().expect("utf-8 path");
    let (ok, _, stderr) = mlx_spec(&[
        "generate",
        "--model",
        model,
        "--prompt",
        "w1",
        "--no-chat-template",
        "--max-tokens",
        "2",
        "--draft",
        "glm52-native-mtp",
    ]);
    assert!(
        !ok && stderr.contains("glm52-native-mtp") && stderr.contains("no complete MTP row"),
        "{stderr}"
    );
}

/// GLM-5.2 lists three EOS ids in `config.json` (no `generation_config.json`
/// here): generation stops at whichever of them comes first, plain and
/// speculative alike (on a GLM-5.2-schema checkpoint, IndexShare and the
/// MTP row's indexer included).
#[test]
fn generation_stops_on_any_of_glm52s_three_eos_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = TinyGlm::glm52_tiny();
    spec.write(dir.path()).expect("checkpoint");
    write_tokenizer(dir.path(), 96);
    let model = dir.path().to_str().expect("utf-8 path");
    let run = |draft: bool| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--prompt",
            "w5 w6 w7 w8 w9 w10",
            "--no-chat-template",
            "--max-tokens",
            "24",
        ];
        if draft {
            args.extend(["--draft", "glm52-native-mtp", "--no-adaptive"]);
        }
        let (ok, out, stderr) = mlx_spec(&args);
        assert!(ok, "{stderr}");
        out.split("==========")
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let plain = run(false);
    assert_eq!(
        plain.len(),
        24,
        "no EOS in the released ids' range: {plain:?}"
    );
    assert_eq!(run(true), plain, "speculation changed the output");
    let id = |word: &str| word.trim_start_matches('w').parse::<u32>().expect("w<id>");
    let unused: Vec<u32> = (0..96)
        .filter(|i| !plain.iter().any(|w| id(w) == *i))
        .take(2)
        .collect();
    assert_eq!(unused.len(), 2, "two ids the output never holds");
    let stop = id(&plain[10]);
    let cut = plain.iter().position(|w| id(w) == stop).expect("present");
    for slot in 0..3 {
        let mut ids = unused.clone();
        ids.insert(slot, stop);
        let mut config = spec.config();
        config["eos_token_id"] = serde_json::json!(ids);
        std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
        for draft in [false, true] {
            assert_eq!(run(draft), plain[..cut], "EOS ids {ids:?} (draft {draft})");
        }
    }
}

/// `--expert-cache-bytes`: a GLM-5.2-schema checkpoint whose routed experts
/// (four MoE layers) are four times the tier (one layer's experts, float32)
/// generates the resident model's text, plainly, with prompt lookup and
/// with the native MTP drafter over 8-bit MTP experts; that drafter without
/// them and a tier smaller than one expert are refused, each naming its
/// option.
#[test]
fn streamed_experts_generate_the_resident_output_and_refusals_name_the_option() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = TinyGlm::glm52_tiny();
    spec.write(dir.path()).expect("checkpoint");
    write_tokenizer(dir.path(), 96);
    let model = dir.path().to_str().expect("utf-8 path");
    // gate, up [32, 32] and down [32, 32] in float32, per expert.
    let expert = 3 * spec.moe_intermediate * spec.hidden * 4;
    let layer = (spec.experts * expert).to_string();
    let base = [
        "generate",
        "--model",
        model,
        "--prompt",
        "w5 w6 w7 w8 w5 w6 w7 w8 w5 w6",
        "--no-chat-template",
        "--max-tokens",
        "16",
    ];
    let text = |s: &str| s.split("==========").next().unwrap_or_default().to_owned();
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend(extra);
        mlx_spec(&args)
    };
    let (ok, resident, stderr) = run(&[]);
    assert!(ok, "{stderr}");
    assert!(!text(&resident).trim().is_empty());
    for extra in [
        &["--expert-cache-bytes", &layer][..],
        &["--expert-cache-bytes", &layer, "--draft", "prompt-lookup"],
        &[
            "--expert-cache-bytes",
            &layer,
            "--mtp-expert-bits",
            "8",
            "--draft",
            "glm52-native-mtp",
        ],
    ] {
        let (ok, streamed, stderr) = run(extra);
        assert!(ok, "{extra:?}: {stderr}");
        assert_eq!(text(&streamed), text(&resident), "{extra:?}");
    }
    let (ok, _, stderr) = run(&[
        "--expert-cache-bytes",
        &layer,
        "--draft",
        "glm52-native-mtp",
    ]);
    assert!(
        !ok && stderr.contains("--mtp-expert-bits 8") && stderr.contains("glm52-native-mtp"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&["--expert-cache-bytes", "100"]);
    assert!(
        !ok && stderr.contains("--expert-cache-bytes") && stderr.contains(&expert.to_string()),
        "{stderr}"
    );
}
