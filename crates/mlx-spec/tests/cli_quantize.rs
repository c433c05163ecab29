//! `mlx-spec quantize`, `quantize-drafter` and `fuse` as a user runs them: the real
//! default model, converted to float32, quantized to 8 bits, still answers;
//! misuse fails naming the problem.

mod common;

use common::mlx_spec;

#[test]
fn a_quantized_real_model_still_answers_and_misuse_is_named() {
    let root = tempfile::tempdir().expect("tempdir");
    let float = root.path().join("f32");
    let quantized = root.path().join("q8");
    let path = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_owned();
    let (ok, _, stderr) = mlx_spec(&["convert", "--out", &path(&float)]);
    assert!(ok, "{stderr}");

    let (ok, _, stderr) = mlx_spec(&[
        "quantize",
        &path(&float),
        &path(&quantized),
        "--bits",
        "8",
        "--group-size",
        "64",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("quantized") && stderr.contains("8 bits"),
        "{stderr}"
    );
    let config = std::fs::read_to_string(quantized.join("config.json")).expect("config");
    assert!(config.contains("\"quantization\""), "{config}");
    assert!(
        quantized.join("tokenizer.json").exists(),
        "tokenizer copied"
    );

    let (ok, stdout, stderr) = mlx_spec(&[
        "generate",
        "--model",
        &path(&quantized),
        "--keep-dtype",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "24",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Paris"), "{stdout}");

    let (ok, _, stderr) = mlx_spec(&[
        "quantize",
        &path(&quantized),
        &path(&root.path().join("again")),
    ]);
    assert!(!ok && stderr.contains("already quantized"), "{stderr}");
    let (ok, _, stderr) = mlx_spec(&["quantize", &path(&float), &path(&quantized)]);
    assert!(!ok && stderr.contains("already exists"), "{stderr}");
    let (ok, _, stderr) = mlx_spec(&[
        "quantize-drafter",
        &path(&float),
        &path(&root.path().join("drafter")),
        "--skip-smoke",
    ]);
    assert!(
        !ok && stderr.contains("mlx-spec quantize") && stderr.contains("Gemma4DSparkModel"),
        "{stderr}"
    );
    let (ok, _, stderr) = mlx_spec(&[
        "quantize-drafter",
        &path(&float),
        &path(&root.path().join("drafter")),
        "--bits",
        "3",
    ]);
    assert!(!ok && stderr.contains("4|8 bits"), "{stderr}");
    let (ok, _, stderr) = mlx_spec(&[
        "quantize",
        &path(&float),
        &path(&root.path().join("mxfp4")),
        "--mode",
        "mxfp4",
        "--group-size",
        "64",
    ]);
    assert!(
        !ok && stderr.contains("mxfp4 quantization does not take group size 64"),
        "{stderr}"
    );
    let (ok, _, stderr) = mlx_spec(&[
        "quantize",
        &path(&float),
        &path(&root.path().join("fp6")),
        "--mode",
        "fp6",
    ]);
    assert!(
        !ok && stderr.contains("unknown quantization mode `fp6`"),
        "{stderr}"
    );
}

/// `quantize-drafter` on a DFlash drafter (`DFlashDraftModel`): the DFlash
/// policy and smoke test, picked by the checkpoint's `architectures`.
#[test]
fn quantize_drafter_takes_a_dflash_drafter() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("dflash");
    std::fs::create_dir_all(&src).expect("mkdir");
    spec_fixtures::dflash::Dflash::tiny()
        .write(&src)
        .expect("write the drafter");
    let out = root.path().join("dflash-q4");
    let path = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_owned();
    let (ok, _, stderr) = mlx_spec(&[
        "quantize-drafter",
        &path(&src),
        &path(&out),
        "--bits",
        "4",
        "--group-size",
        "32",
    ]);
    assert!(
        ok && stderr.contains("reload smoke test passed"),
        "{stderr}"
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).expect("config"))
            .expect("json");
    assert_eq!(config["quantization"]["bits"], 4, "{config}");
    assert_eq!(config["architectures"][0], "DFlashDraftModel");
}

/// `mlx-spec fuse` as mlx-lm's: the adapter merged into the tiny llama (its
/// tokenizer files copied), the fused model generates on its own; an
/// existing output and a missing adapter are named.
#[test]
fn fuse_merges_an_adapter_and_misuse_is_named() {
    let root = tempfile::tempdir().expect("tempdir");
    let (model, adapter, fused) = (
        root.path().join("tiny"),
        root.path().join("adapter"),
        root.path().join("fused"),
    );
    for dir in [&model, &adapter] {
        std::fs::create_dir(dir).expect("mkdir");
    }
    common::tiny_llama_with_template(&model, "{{ messages[0].content }}");
    spec_fixtures::adapter::LoraAdapter::lora(1, 5)
        .write(&adapter, &spec_fixtures::llama::Llama::tiny(7))
        .expect("adapter");
    let path = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_owned();
    let fuse = |save: &std::path::Path, adapter: &std::path::Path| {
        mlx_spec(&[
            "fuse",
            "--model",
            &path(&model),
            "--adapter-path",
            &path(adapter),
            "--save-path",
            &path(save),
        ])
    };
    let (ok, _, stderr) = fuse(&fused, &adapter);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("fused the updates of 7 modules"),
        "{stderr}"
    );
    assert!(fused.join("tokenizer.json").exists() && fused.join("tokenizer_config.json").exists());
    let (ok, stdout, stderr) = mlx_spec(&[
        "generate",
        "--model",
        &path(&fused),
        "--prompt",
        "w3 w4 w5",
        "-m",
        "8",
    ]);
    assert!(ok && stdout.contains("Generation:"), "{stderr}");

    let (ok, _, stderr) = fuse(&fused, &adapter);
    assert!(!ok && stderr.contains("already exists"), "{stderr}");
    let missing = root.path().join("no-adapter");
    let (ok, _, stderr) = fuse(&root.path().join("fused2"), &missing);
    assert!(
        !ok && stderr.contains("no such adapter directory") && stderr.contains("no-adapter"),
        "{stderr}"
    );
}
