//! `mlx-spec serve --pipeline` under `launch`, over loopback: a tiny GLM
//! split over 2 and 3 local ranks answers concurrent requests (plain,
//! prompt lookup, its MTP row drafting) as one process answers each alone,
//! token for token, with the requests sharing pipeline passes, and a repeat
//! from the prefix cache answers the same; a SIGINT to
//! rank 0, or a SIGTERM to the launcher, ends every rank. A rank killed mid-serve ends every rank, named by
//! `launch`; without `launch`, rank 0 stops on its own naming the lost rank.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{
    http_post, http_send, metric, processes_marked, rank_process, served_address, tiny_glm,
};

/// Ranks on one machine share its cores: one BLAS thread each.
const BLAS: (&str, &str) = ("OPENBLAS_NUM_THREADS", "1");
/// The longest any rank may take to end once told (or once a peer died).
const LIMIT: Duration = Duration::from_secs(60);

/// A started `mlx-spec` (a server or a launcher), its stderr collected on a
/// thread; killed, with every process carrying its mark, if the test ends
/// without waiting for it.
struct Started {
    child: Child,
    stderr: Option<JoinHandle<String>>,
    mark: String,
}

impl Started {
    fn spawn(args: &[&str], mark: &str, envs: &[(&str, &str)]) -> (Started, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx-spec"));
        cmd.args(args)
            .env(BLAS.0, BLAS.1)
            .env("MLX_SPEC_TEST_MARK", mark)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start mlx-spec");
        let mut err = child.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        });
        let addr = served_address(&mut child);
        let started = Started {
            child,
            stderr: Some(stderr),
            mark: mark.to_owned(),
        };
        (started, addr)
    }

    /// Waits at most [`LIMIT`] for the end: the status, stderr and the time
    /// it took.
    fn wait(mut self) -> (ExitStatus, String, Duration) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if start.elapsed() > LIMIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("still running {LIMIT:?} later: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status, self.stderr(), start.elapsed())
    }

    /// What it wrote on stderr (once it has ended).
    fn stderr(&mut self) -> String {
        self.stderr
            .take()
            .map(|t| t.join().expect("stderr reader"))
            .unwrap_or_default()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for pid in processes_marked(&self.mark) {
            signal("-KILL", &pid);
        }
    }
}

fn signal(which: &str, pid: &str) {
    let status = Command::new("kill")
        .args([which, pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid}");
}

fn serve_args(model: &str) -> Vec<&str> {
    vec![
        "serve",
        "--port",
        "0",
        "--model",
        model,
        "--max-batch",
        "4",
        "--draft-provider",
        "prompt-lookup",
        "--draft-provider",
        "glm52-native-mtp",
    ]
}

fn launch_args<'a>(ranks: &'a str, model: &'a str) -> Vec<&'a str> {
    let mut args = vec!["launch", "--np", ranks, "--"];
    args.extend(serve_args(model));
    args.push("--pipeline");
    args
}

fn asks() -> Vec<Value> {
    let ask = |prompt: &str, speculative: Value| json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "speculative": speculative});
    vec![
        ask("w5 w6 w7 w8 w5 w6 w7", json!(false)),
        ask("w5 w6 w7 w8 w5 w6 w7", json!({"provider": "prompt-lookup"})),
        ask(
            "w9 w10 w11 w12 w9 w10",
            json!({"provider": "glm52-native-mtp"}),
        ),
        ask(
            "w20 w21 w22 w20 w21",
            json!({"provider": "prompt-lookup", "num_draft_tokens": 2}),
        ),
    ]
}

/// The text and token count of a completion that must have succeeded.
fn answer(status: u16, body: &Value) -> (String, u64) {
    assert_eq!(status, 200, "{body}");
    (
        body["choices"][0]["text"]
            .as_str()
            .expect("text")
            .to_owned(),
        body["usage"]["completion_tokens"]
            .as_u64()
            .expect("completion_tokens"),
    )
}

fn mark(what: &str) -> String {
    format!("serve-pipeline-{what}-{}", std::process::id())
}

#[test]
fn pipelined_servers_of_2_and_3_ranks_batch_requests_and_answer_as_one_process() {
    let dir = tiny_glm();
    let model = dir.path().to_str().expect("utf-8 path");
    let alone: Vec<(String, u64)> = {
        let (_server, addr) = Started::spawn(&serve_args(model), &mark("single"), &[]);
        asks()
            .iter()
            .map(|ask| {
                let (status, body) = http_post(&addr, "/v1/completions", ask);
                answer(status, &body)
            })
            .collect()
    };
    assert!(alone.iter().all(|(text, n)| !text.is_empty() && *n > 0));
    for ranks in ["2", "3"] {
        let mark = mark(&format!("batch-{ranks}"));
        let (launched, addr) = Started::spawn(&launch_args(ranks, model), &mark, &[]);
        let together: Vec<(String, u64)> = std::thread::scope(|scope| {
            let clients: Vec<_> = asks()
                .into_iter()
                .map(|ask| {
                    let addr = &addr;
                    scope.spawn(move || http_post(addr, "/v1/completions", &ask))
                })
                .collect();
            clients
                .into_iter()
                .map(|c| {
                    let (status, body) = c.join().expect("a client");
                    answer(status, &body)
                })
                .collect()
        });
        assert_eq!(together, alone, "{ranks} ranks");
        // Steps whose pass carried more than one request's rows.
        let steps = metric(&addr, "mlx_spec_rows_per_step_count");
        let alone_steps = metric(&addr, "mlx_spec_rows_per_step_bucket{le=\"1\"}");
        assert!(
            steps - alone_steps >= 1.0,
            "{ranks} ranks: no pipeline pass was shared ({steps} steps, {alone_steps} of one request)"
        );
        // A repeat starts from the prefix cache (the followers copy their
        // sets too) and answers the same.
        let (status, body) = http_post(&addr, "/v1/completions", &asks()[0]);
        assert_eq!(answer(status, &body), alone[0], "{ranks} ranks, repeat");
        let prompt = body["usage"]["prompt_tokens"]
            .as_u64()
            .expect("prompt_tokens");
        assert_eq!(
            body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
            Some(prompt - 1),
            "{body}"
        );
        // Stopped through rank 0 itself, or through the launcher, which
        // passes it on to rank 0.
        let stopped = if ranks == "2" {
            rank_process(&mark, 0).expect("rank 0 runs")
        } else {
            launched.child.id().to_string()
        };
        signal(if ranks == "2" { "-INT" } else { "-TERM" }, &stopped);
        let (status, stderr, took) = launched.wait();
        assert!(status.success(), "{ranks} ranks: {stderr}");
        for r in 0..ranks.parse().expect("ranks") {
            assert!(
                stderr.contains(&format!("rank {r} of {ranks}: layers")),
                "{stderr}"
            );
        }
        assert!(took < LIMIT, "{took:?}");
        assert_eq!(processes_marked(&mark), Vec::<String>::new(), "orphans");
    }
}

#[test]
fn a_rank_killed_mid_serve_stops_every_rank_and_is_named() {
    let dir = tiny_glm();
    let model = dir.path().to_str().expect("utf-8 path");
    let mark = mark("killed");
    let (launched, addr) = Started::spawn(&launch_args("2", model), &mark, &[]);
    let body = json!({"prompt": "w5 w6 w7 w8", "max_tokens": 480, "temperature": 0,
        "stream": true, "speculative": false});
    let mut reader = BufReader::new(http_send(
        &addr,
        "POST",
        "/v1/completions",
        &body.to_string(),
    ));
    let mut line = String::new();
    let mut chunks = 0;
    while chunks < 2 {
        line.clear();
        assert!(reader.read_line(&mut line).expect("read") > 0, "no stream");
        chunks += usize::from(line.starts_with("data: {"));
    }
    let follower = rank_process(&mark, 1).expect("rank 1 runs");
    signal("-KILL", &follower);
    // The stream breaks off, 480 tokens far from done: closed, or (when
    // rank 0 sees the lost link before `launch` stops it) an error naming
    // rank 1.
    let rest: Vec<String> = reader.lines().map_while(Result::ok).collect();
    assert!(
        !rest
            .iter()
            .any(|l| l.contains("\"finish_reason\":\"length\"")),
        "{rest:?}"
    );
    assert!(
        rest.iter()
            .filter(|l| l.contains("\"error\""))
            .all(|l| l.contains("receiving from rank 1") || l.contains("sending to rank 1")),
        "{rest:?}"
    );
    let (status, stderr, took) = launched.wait();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("rank 1 (signal: 9"), "{stderr}");
    assert!(took < LIMIT, "{took:?}");
    assert_eq!(processes_marked(&mark), Vec::<String>::new(), "orphans");
}

#[test]
fn without_launch_rank_0_stops_when_its_follower_dies_naming_it() {
    let dir = tiny_glm();
    let model = dir.path().to_str().expect("utf-8 path");
    let ring = tempfile::tempdir().expect("tempdir");
    let hostfile = ring.path().join("ring.json");
    mlx_distributed::Hostfile::loopback(2)
        .expect("ports")
        .write(&hostfile)
        .expect("write");
    let hostfile = hostfile.to_str().expect("utf-8 path");
    let mark = mark("head-alone");
    let mut args = serve_args(model);
    args.push("--pipeline");
    let env = |rank| {
        [
            ("MLX_RANK", rank),
            ("MLX_HOSTFILE", hostfile),
            ("MLX_SPEC_JOIN_TIMEOUT", "30"),
            (
                "MLX_SPEC_PIPELINE_SECRET",
                "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
            ),
        ]
    };
    // The follower prints nothing on stdout: it is started by hand, and
    // only rank 0's address is read.
    let mut follower = Command::new(env!("CARGO_BIN_EXE_mlx-spec"))
        .args(&args)
        .envs(env("1"))
        .env(BLAS.0, BLAS.1)
        .env("MLX_SPEC_TEST_MARK", &mark)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rank 1");
    let (head, addr) = Started::spawn(&args, &mark, &env("0"));
    let (status, body) = http_post(&addr, "/v1/completions", &asks()[0]);
    answer(status, &body);
    follower.kill().expect("kill rank 1");
    follower.wait().expect("reap rank 1");
    // The next pass finds the follower gone: the request fails, and the
    // server stops.
    let (status, body) = http_post(&addr, "/v1/completions", &asks()[1]);
    assert_eq!(status, 500, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("rank 1"), "{message}");
    let (status, stderr, _) = head.wait();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the pipeline is broken") && stderr.contains("rank 1"),
        "{stderr}"
    );
    assert_eq!(processes_marked(&mark), Vec::<String>::new(), "orphans");
}
