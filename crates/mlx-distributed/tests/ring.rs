//! The ring backend over loopback with 2 and 3 local processes, and its
//! failures: every scenario runs real processes (this test binary started
//! again as each rank, through the ignored `rank_entry` test).

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mlx_distributed::{init, Backend, DistError, Hostfile, InitOptions, HOSTFILE_ENV, RANK_ENV};
use mlx_rs::{Array, Dtype};

const CASE_ENV: &str = "MLX_DISTRIBUTED_TEST_CASE";
const TIMEOUT_ENV: &str = "MLX_DISTRIBUTED_TEST_TIMEOUT_MS";

fn values(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(Dtype::Float32).expect("cast");
    a.eval().expect("eval");
    a.as_slice::<f32>().to_vec()
}

/// Every operation a ring offers, checked against what each rank must see.
fn run_collectives() -> Result<String, DistError> {
    let group = init(&InitOptions::new(Backend::Ring))?;
    let (r, n) = (group.rank(), group.size());
    let rf = r as f32;
    let total: f32 = (1..=n).map(|k| k as f32).sum();
    let sum = group.all_sum(&Array::from_slice(&[rf + 1.0, 10.0 * (rf + 1.0)], &[2]))?;
    assert_eq!(
        values(&sum),
        vec![total, 10.0 * total],
        "all_sum on rank {r}"
    );
    let gathered = group.all_gather(&Array::from_slice(&[rf, -rf], &[1, 2]))?;
    assert_eq!(gathered.shape(), &[n as i32, 2]);
    let want: Vec<f32> = (0..n).flat_map(|k| [k as f32, -(k as f32)]).collect();
    assert_eq!(values(&gathered), want, "all_gather on rank {r}");
    let max = group.all_max(&Array::from_slice(&[rf, -rf], &[2]))?;
    assert_eq!(values(&max), vec![(n - 1) as f32, 0.0]);
    let min = group.all_min(&Array::from_slice(&[rf, -rf], &[2]))?;
    assert_eq!(values(&min), vec![0.0, -((n - 1) as f32)]);
    // A relay 0 -> 1 -> .. -> n-1 -> 0, each adding its rank + 1; typed
    // receives and receives shaped like an array both.
    let mut x = Array::from_slice(&[0.0f32, 1.0], &[2]);
    if r > 0 {
        x = group.recv(&[2], Dtype::Float32, r - 1)?;
    }
    x = x.add(Array::from_f32(rf + 1.0)).expect("add");
    let next = (r + 1) % n;
    group.send(&x, next)?.eval().expect("send");
    if r == 0 {
        let back = group.recv_like(&x, n - 1)?;
        assert_eq!(
            values(&back),
            vec![total, total + 1.0],
            "relay back on rank 0"
        );
    }
    // What a ring cannot do is an error, not a hang or an abort.
    let split = match group.split(0, None) {
        Ok(g) => panic!("split gave a group of {} (rank {})", g.size(), g.rank()),
        Err(e) => e,
    };
    let scatter = group
        .sum_scatter(&Array::from_slice(&vec![1.0f32; 2 * n], &[2 * n as i32]))
        .expect_err("ring has no sum_scatter");
    let own = group.send(&x, r).expect_err("sending to oneself");
    Ok(format!(
        "rank {r} of {n} ok; split: {split}; scatter: {scatter}; self: {own}"
    ))
}

/// The ignored entry each child process runs, by `CASE_ENV`.
#[test]
#[ignore = "run as a rank by the other tests of this file"]
fn rank_entry() {
    let Ok(case) = std::env::var(CASE_ENV) else {
        return;
    };
    let timeout = std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|t| t.parse().ok())
        .map_or(Duration::from_secs(60), Duration::from_millis);
    let result = match case.as_str() {
        "collectives" => run_collectives(),
        "init" => init(&InitOptions {
            timeout,
            ..InitOptions::new(Backend::Ring)
        })
        .map(|g| format!("rank {} of {} joined", g.rank(), g.size())),
        other => panic!("unknown case {other}"),
    };
    match result {
        Ok(line) => println!("RESULT ok: {line}"),
        Err(e) => println!("RESULT error: {e}"),
    }
}

/// A rank process of this test binary.
fn spawn(case: &str, rank: Option<usize>, hostfile: &Path, extra: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "rank_entry",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CASE_ENV, case)
    .env(HOSTFILE_ENV, hostfile)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    match rank {
        Some(r) => cmd.env(RANK_ENV, r.to_string()),
        None => cmd.env_remove(RANK_ENV),
    };
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a rank")
}

/// Waits for every child at most `limit`, killing all of them past it; the
/// `RESULT` line of each, in order.
fn collect(children: Vec<Child>, limit: Duration) -> Vec<String> {
    let start = Instant::now();
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    let mut out = vec![None; children.len()];
    while out.iter().any(Option::is_none) {
        for (i, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            if let Some(status) = child.try_wait().expect("wait") {
                let mut stdout = String::new();
                let mut stderr = String::new();
                let mut child = slot.take().expect("present");
                // Already reaped by `try_wait`; this returns at once.
                let _ = child.wait();
                child
                    .stdout
                    .take()
                    .expect("piped")
                    .read_to_string(&mut stdout)
                    .expect("read");
                child
                    .stderr
                    .take()
                    .expect("piped")
                    .read_to_string(&mut stderr)
                    .expect("read");
                let line = stdout
                    .lines()
                    .find_map(|l| l.find("RESULT").map(|at| l[at..].to_string()));
                out[i] = Some(line.unwrap_or_else(|| {
                    format!("no result (exit {status}); stdout: {stdout}; stderr: {stderr}")
                }));
            }
        }
        if start.elapsed() > limit {
            for child in children.iter_mut().flatten() {
                let _ = child.kill();
                let _ = child.wait();
            }
            panic!("ranks still running after {limit:?}: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    out.into_iter().map(|l| l.unwrap_or_default()).collect()
}

fn ring_of(n: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let hostfile = dir.path().join("hosts.json");
    Hostfile::loopback(n)
        .expect("ports")
        .write(&hostfile)
        .expect("write");
    let children = (0..n)
        .map(|r| spawn("collectives", Some(r), &hostfile, &[]))
        .collect();
    let results = collect(children, Duration::from_secs(90));
    for (r, line) in results.iter().enumerate() {
        assert!(
            line.starts_with(&format!("RESULT ok: rank {r} of {n} ok")),
            "rank {r}: {line}"
        );
        assert!(
            line.contains("split not supported") || line.contains("refused to split"),
            "{line}"
        );
        assert!(line.contains("sum_scatter"), "{line}");
        assert!(line.contains("not another process"), "{line}");
    }
}

#[test]
fn two_ranks_run_every_operation() {
    ring_of(2);
}

#[test]
fn three_ranks_run_every_operation() {
    ring_of(3);
}

/// Builds `slow_cond_wait.c` into `dir` with clang (a prerequisite of the
/// build); the library's path.
#[cfg(target_os = "linux")]
fn slow_cond_wait(dir: &Path) -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slow_cond_wait.c");
    let lib = dir.join("slow_cond_wait.so");
    let out = Command::new("clang")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&source)
        .arg("-ldl")
        .output()
        .expect("clang (a prerequisite `cargo xtask test` installs)");
    assert!(
        out.status.success(),
        "building {}: {}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

/// MLX's ring teardown at exit can hang for ever (a lost wakeup, see
/// `ffi::init`); with every condition wait slowed so that the race is lost
/// on each exit, ranks that did their work still end. (`LD_PRELOAD`: glibc.)
#[cfg(target_os = "linux")]
#[test]
fn ranks_end_even_where_the_ring_teardown_would_hang() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hostfile = dir.path().join("hosts.json");
    Hostfile::loopback(2)
        .expect("ports")
        .write(&hostfile)
        .expect("write");
    let slow = [
        (
            "LD_PRELOAD",
            slow_cond_wait(dir.path()).display().to_string(),
        ),
        ("MLX_DISTRIBUTED_TEST_SLOW_WAIT_MS", "100".to_string()),
    ];
    let children = (0..2)
        .map(|r| spawn("collectives", Some(r), &hostfile, &slow))
        .collect();
    let results = collect(children, Duration::from_secs(60));
    for (r, line) in results.iter().enumerate() {
        assert!(
            line.starts_with(&format!("RESULT ok: rank {r} of 2 ok")),
            "rank {r}: {line}"
        );
    }
}

#[test]
fn a_rank_that_never_starts_is_named_within_the_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hostfile = dir.path().join("hosts.json");
    let file = Hostfile::loopback(3).expect("ports");
    file.write(&hostfile).expect("write");
    // Ranks 0 and 1 start; rank 2 never does.
    let timeout = [(TIMEOUT_ENV, "3000".to_string())];
    let children = (0..2)
        .map(|r| spawn("init", Some(r), &hostfile, &timeout))
        .collect();
    let start = Instant::now();
    let results = collect(children, Duration::from_secs(60));
    let missing = format!("rank 2 ({})", file.ranks[2][0]);
    for (r, line) in results.iter().enumerate() {
        assert!(
            line.starts_with("RESULT error:")
                && line.contains("did not form")
                && line.contains(&missing),
            "rank {r}: {line}"
        );
    }
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn a_bad_setting_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("hosts.json");
    Hostfile::loopback(2)
        .expect("ports")
        .write(&good)
        .expect("write");
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "[[\"127.0.0.1\"]]").expect("write");
    let cases = [
        (
            Some(5),
            good.clone(),
            "MLX_RANK=5 but the file lists 2 ranks",
        ),
        (None, good.clone(), "MLX_RANK is not set"),
        (Some(0), dir.path().join("absent.json"), "cannot be read"),
        (Some(0), broken, "is not an ip:port address"),
    ];
    for (rank, file, want) in cases {
        let results = collect(
            vec![spawn("init", rank, &file, &[])],
            Duration::from_secs(30),
        );
        assert!(
            results[0].starts_with("RESULT error:") && results[0].contains(want),
            "{want}: {results:?}"
        );
    }
}
