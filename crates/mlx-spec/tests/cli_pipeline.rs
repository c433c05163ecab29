//! `mlx-spec generate --pipeline` under `launch`: a tiny GLM split over 2
//! and 3 local ranks gives the single-process tokens and log-probabilities,
//! plainly and with its MTP row drafting, and a tiny llama with the
//! `deepspec` drafter (its taps of layers 0 and 2 cross the ranks); a rank that dies mid-generation
//! ends every rank in bounded time, named, with no orphan; a follower whose
//! head dies exits on its own naming the head; a `--regex` constraint holds
//! over 2 ranks, plainly and with the MTP row, with the single process's
//! tokens.

mod common;

use common::{mlx_spec_env as mlx_spec, processes_marked, text, tiny_glm, write_tokenizer};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The text and the per-token lines (`--logprobs`): what must not change.
fn tokens(stdout: &str) -> String {
    stdout
        .split("==========")
        .take(2)
        .collect::<Vec<_>>()
        .join("|")
}
fn generate_args<'a>(model: &'a str, draft: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "generate",
        "--model",
        model,
        "--prompt",
        "w5 w6 w7 w8 w5 w6 w7",
        "--no-chat-template",
        "--max-tokens",
        "16",
        "--logprobs",
    ];
    args.extend(draft);
    args
}

#[test]
fn pipelines_of_2_and_3_ranks_give_the_single_process_tokens() {
    let dir = tiny_glm();
    let model = dir.path().to_str().expect("utf-8 path");
    for draft in [&[][..], &["--draft", "glm52-native-mtp"][..]] {
        let (single, _) = mlx_spec(&generate_args(model, draft), &[]);
        assert!(single.status.success(), "{}", text(&single.stderr));
        let want = tokens(&text(&single.stdout));
        assert!(!want.trim().is_empty());
        for n in ["2", "3"] {
            let mut args = vec!["launch", "--np", n, "--"];
            args.extend(generate_args(model, draft));
            args.push("--pipeline");
            let (out, _) = mlx_spec(&args, &[]);
            let stdout = text(&out.stdout);
            assert!(
                out.status.success(),
                "{n} ranks {draft:?}: {}",
                text(&out.stderr)
            );
            assert_eq!(tokens(&stdout), want, "{n} ranks {draft:?}");
            assert!(stdout.contains(&format!("Pipeline: {n} ranks")), "{stdout}");
            let stderr = text(&out.stderr);
            for r in 0..n.parse().expect("n") {
                assert!(
                    stderr.contains(&format!("rank {r} of {n}: layers")),
                    "{stderr}"
                );
            }
        }
    }
}

#[test]
fn deepspec_taps_cross_the_ranks_and_the_tokens_stay_the_same() {
    let target = tempfile::tempdir().expect("tempdir");
    let drafter = tempfile::tempdir().expect("tempdir");
    let dspark = spec_fixtures::dspark::Dspark::tiny();
    spec_fixtures::llama::Llama {
        name: "tiny-dspark-target",
        hidden: dspark.hidden,
        layers: dspark.target_layers,
        vocab: dspark.vocab,
        intermediate: 64,
        heads: 4,
        kv_heads: 2,
        tied: true,
        hub_extras: false,
        ..spec_fixtures::llama::GATE_LLAMA
    }
    .write(target.path())
    .expect("target");
    write_tokenizer(target.path(), dspark.vocab);
    dspark.write(drafter.path()).expect("drafter");
    let model = target.path().to_str().expect("utf-8 path");
    let draft = [
        "--draft",
        "deepspec",
        "--draft-model",
        drafter.path().to_str().expect("utf-8 path"),
    ];
    let (single, _) = mlx_spec(&generate_args(model, &draft), &[]);
    assert!(single.status.success(), "{}", text(&single.stderr));
    let want = tokens(&text(&single.stdout));
    for n in ["2", "3"] {
        let mut args = vec!["launch", "--np", n, "--"];
        args.extend(generate_args(model, &draft));
        args.push("--pipeline");
        let (out, _) = mlx_spec(&args, &[]);
        assert!(out.status.success(), "{n} ranks: {}", text(&out.stderr));
        assert_eq!(tokens(&text(&out.stdout)), want, "{n} ranks");
    }
}

#[test]
fn a_pipeline_rank_that_dies_mid_generation_stops_every_rank() {
    let dir = tiny_glm();
    let model = dir.path().to_str().expect("utf-8 path");
    let mark = format!("pipeline-dies-{}", std::process::id());
    let mut args = vec!["launch", "--np", "3", "--"];
    args.extend(generate_args(model, &[]));
    args.extend(["--pipeline", "--pipeline-fault", "1:3"]);
    let (out, took) = mlx_spec(&args, &[("MLX_SPEC_TEST_MARK", &mark)]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("rank 1 (exit status: 3)"), "{stderr}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert_eq!(
        processes_marked(&mark),
        Vec::<String>::new(),
        "orphaned ranks"
    );
}

#[test]
fn a_follower_whose_head_dies_exits_naming_it() {
    let dir = tiny_glm();
    let model = dir.path().to_str().expect("utf-8 path");
    let ring_dir = tempfile::tempdir().expect("tempdir");
    let hostfile = ring_dir.path().join("ring.json");
    mlx_distributed::Hostfile::loopback(2)
        .expect("ports")
        .write(&hostfile)
        .expect("write");
    let mut args = generate_args(model, &[]);
    args.extend(["--pipeline", "--pipeline-fault", "0:2"]);
    let start = Instant::now();
    let spawn = |rank: &str| {
        Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
            .args(&args)
            .env("MLX_RANK", rank)
            .env("MLX_HOSTFILE", &hostfile)
            .env("MLX_SPEC_JOIN_TIMEOUT", "20")
            .env("MLX_SPEC_PIPELINE_SECRET", SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a rank")
    };
    let head = spawn("0");
    let follower = spawn("1");
    let head = head.wait_with_output().expect("head");
    let follower = follower.wait_with_output().expect("follower");
    assert_eq!(head.status.code(), Some(3), "{}", text(&head.stderr));
    let stderr = text(&follower.stderr);
    assert!(!follower.status.success(), "{stderr}");
    assert!(stderr.contains("rank 1: receiving from rank 0"), "{stderr}");
    assert!(start.elapsed() < Duration::from_secs(60));
}

/// The secret of the ranks these tests start by hand.
const SECRET: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// Starts both ranks of a 2-rank pipeline by hand, each with its secret
/// (none for `None`), and waits for them.
fn hand_ranks(secrets: [Option<&str>; 2]) -> Vec<std::process::Output> {
    let dir = tiny_glm();
    let model = dir.path().to_str().expect("utf-8 path");
    let ring_dir = tempfile::tempdir().expect("tempdir");
    let hostfile = ring_dir.path().join("ring.json");
    mlx_distributed::Hostfile::loopback(2)
        .expect("ports")
        .write(&hostfile)
        .expect("write");
    let mut args = generate_args(model, &[]);
    args.push("--pipeline");
    let ranks: Vec<_> = secrets
        .iter()
        .enumerate()
        .map(|(rank, secret)| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx-spec"));
            cmd.args(&args)
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile)
                .env("MLX_SPEC_JOIN_TIMEOUT", "20")
                .env_remove("MLX_SPEC_PIPELINE_SECRET")
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            if let Some(s) = secret {
                cmd.env("MLX_SPEC_PIPELINE_SECRET", s);
            }
            cmd.spawn().expect("spawn a rank")
        })
        .collect();
    ranks
        .into_iter()
        .map(|r| r.wait_with_output().expect("rank"))
        .collect()
}

#[test]
fn a_rank_with_another_secret_is_refused_naming_the_ranks() {
    let start = Instant::now();
    let other = "b".repeat(64);
    let out = hand_ranks([Some(SECRET), Some(&other)]);
    let (head, follower) = (text(&out[0].stderr), text(&out[1].stderr));
    assert!(!out[0].status.success(), "{head}");
    assert!(!out[1].status.success(), "{follower}");
    assert!(
        head.contains("rank 0: rank 1 failed the link handshake"),
        "{head}"
    );
    assert!(
        follower.contains("rank 1: rank 0 failed the link handshake"),
        "{follower}"
    );
    assert!(!head.contains("panicked"), "{head}");
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn a_rank_without_the_secret_refuses_to_start_and_says_how() {
    // Rank 1 alone, without a secret: it fails before joining (rank 0 is
    // never started).
    let dir = tiny_glm();
    let model = dir.path().to_str().expect("utf-8 path");
    let ring_dir = tempfile::tempdir().expect("tempdir");
    let hostfile = ring_dir.path().join("ring.json");
    mlx_distributed::Hostfile::loopback(2)
        .expect("ports")
        .write(&hostfile)
        .expect("write");
    let mut args = generate_args(model, &[]);
    args.push("--pipeline");
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(&args)
        .env("MLX_RANK", "1")
        .env("MLX_HOSTFILE", &hostfile)
        .env("MLX_SPEC_JOIN_TIMEOUT", "20")
        .env_remove("MLX_SPEC_PIPELINE_SECRET")
        .output()
        .expect("run a rank");
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("start the ranks with `mlx-spec launch`")
            && stderr.contains("MLX_SPEC_PIPELINE_SECRET"),
        "{stderr}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "failed before joining"
    );
}

#[test]
fn a_constraint_holds_over_a_pipeline_and_the_tokens_stay_the_same() {
    let dir = tiny_glm();
    // One token a byte, so the grammar reads the vocabulary.
    common::write_byte_tokenizer(dir.path());
    let model = dir.path().to_str().expect("utf-8 path");
    let regex = ["--regex", "(ab|cd|e){2,6}!"];
    let mut plain = None;
    for draft in [&[][..], &["--draft", "glm52-native-mtp"][..]] {
        let mut single_args = generate_args(model, draft);
        single_args.extend(regex);
        let (single, _) = mlx_spec(&single_args, &[]);
        assert!(single.status.success(), "{}", text(&single.stderr));
        let want = tokens(&text(&single.stdout));
        let answer = want.split('|').next().unwrap_or_default().trim().to_owned();
        let body = answer
            .strip_suffix('!')
            .unwrap_or_else(|| panic!("{answer:?}"));
        let pieces = body.replace("ab", "").replace("cd", "").replace('e', "");
        assert!(pieces.is_empty() && !body.is_empty(), "{answer:?}");
        // The MTP row's drafts, cut by the constraint, change nothing.
        assert_eq!(
            plain.get_or_insert_with(|| want.clone()),
            &want,
            "{draft:?}"
        );
        let mut args = vec!["launch", "--np", "2", "--"];
        args.extend(generate_args(model, draft));
        args.extend(regex);
        args.push("--pipeline");
        let (out, _) = mlx_spec(&args, &[]);
        assert!(out.status.success(), "{draft:?}: {}", text(&out.stderr));
        assert_eq!(tokens(&text(&out.stdout)), want, "2 ranks {draft:?}");
    }
}
