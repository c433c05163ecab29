//! `mlx-spec launch` (as `mlx.launch`): starts the ranks of a distributed
//! job, on this machine (`--np N`, a generated loopback hostfile) or one per
//! host of a hostfile (printed, or run over ssh), watches them, and stops
//! every rank as soon as one fails. SIGINT or SIGTERM to the launcher is
//! passed to rank 0 as SIGTERM (the ranks run in their own process group,
//! so a terminal's Ctrl-C reaches the launcher alone): rank 0 ends the job
//! as it ends (`serve` stops and tells the other ranks). `mlx-spec
//! distributed-check` is the job that proves a group works.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::ops::ControlFlow;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mlx_distributed::{Backend, Hostfile, InitOptions, HOSTFILE_ENV, RANK_ENV};
use spec_pipeline::{PipelineSecret, SECRET_ENV};

use crate::signals::{self, SignalKind};

/// `mlx-spec launch`.
#[derive(clap::Args)]
pub struct Args {
    /// Start this many ranks on this machine (loopback ring; each gets
    /// cores / N BLAS threads unless `OPENBLAS_NUM_THREADS` is set).
    #[arg(long, conflicts_with = "hosts")]
    np: Option<usize>,
    /// mlx.launch's hostfile: a JSON list of `{"ssh": HOST, "ips": [IP, ..]}`,
    /// one entry per rank.
    #[arg(long)]
    hosts: Option<PathBuf>,
    /// With `--hosts`: start the ranks over ssh instead of printing the commands.
    #[arg(long, requires = "hosts")]
    ssh: bool,
    /// The ssh program (`--ssh`).
    #[arg(long, default_value = "ssh", hide = true)]
    ssh_program: String,
    /// First port of the ring (rank i listens on this + i); with `--np`, 0
    /// asks the system for free ports.
    #[arg(long, default_value_t = 0)]
    starting_port: u16,
    /// Where every host writes the ring hostfile (`--hosts`); by default a
    /// private directory each rank's shell makes with `mktemp -d`, removed
    /// by the rank once it has joined.
    #[arg(long)]
    hostfile_path: Option<PathBuf>,
    /// Seconds the ranks wait for each other to join.
    #[arg(long, default_value_t = 60)]
    join_timeout: u64,
    /// The mlx-spec command every rank runs (after `--`), e.g. `-- generate ...`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The environment variable carrying `--join-timeout` to the ranks.
pub const JOIN_TIMEOUT_ENV: &str = "MLX_SPEC_JOIN_TIMEOUT";

/// Set on a remote rank to the private directory its shell made for the
/// hostfile: the rank removes it once it has joined (`joined`).
pub const HOSTFILE_DIR_ENV: &str = "MLX_SPEC_HOSTFILE_DIR";

/// Called by a rank once it has joined its group: MLX has read the
/// hostfile, so a directory made for it alone (`HOSTFILE_DIR_ENV`) goes.
pub fn joined() {
    if let Some(dir) = std::env::var_os(HOSTFILE_DIR_ENV) {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(error = %e, dir = ?dir, "removing the hostfile's directory");
        }
    }
}

/// OpenBLAS's thread count (our GEMM front follows it too).
const BLAS_THREADS_ENV: &str = "OPENBLAS_NUM_THREADS";

/// BLAS threads for each of `ranks` ranks on this machine: its cores shared
/// out, at least one each. OpenBLAS's idle workers spin, and ranks whose
/// threads outnumber the cores starve each other (two ranks of two threads
/// on two cores ran 20x slower than of one each).
fn blas_threads(ranks: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / ranks.max(1)).max(1)
}

/// The join options a rank uses: ring, strict, the launcher's timeout.
pub fn join_options() -> InitOptions {
    let secs = std::env::var(JOIN_TIMEOUT_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    InitOptions {
        timeout: Duration::from_secs(secs),
        ..InitOptions::new(Backend::Ring)
    }
}

/// One entry of mlx.launch's hostfile.
#[derive(serde::Deserialize)]
struct Host {
    ssh: String,
    ips: Vec<IpAddr>,
}

fn read_hosts(path: &Path) -> Result<Vec<Host>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the hostfile {}", path.display()))?;
    let hosts: Vec<Host> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected a JSON list of {{\"ssh\": HOST, \"ips\": [IP, ..]}}",
            path.display()
        )
    })?;
    if hosts.is_empty() {
        bail!("{}: lists no host", path.display());
    }
    for (rank, h) in hosts.iter().enumerate() {
        if h.ips.is_empty() {
            bail!("{}: host {rank} ({}) lists no ip", path.display(), h.ssh);
        }
    }
    Ok(hosts)
}

/// Runs `mlx-spec launch`.
pub fn run(args: Args) -> Result<()> {
    let exe = std::env::current_exe().context("locating the mlx-spec binary")?;
    if let Some(n) = args.np {
        if n == 0 {
            bail!("--np must be at least 1");
        }
        let ring = if args.starting_port == 0 {
            Hostfile::loopback(n)?
        } else {
            let ranks = (0..n)
                .map(|i| {
                    let port = port_of(args.starting_port, i)?;
                    Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))])
                })
                .collect::<Result<_>>()?;
            Hostfile { ranks }
        };
        // A fresh private directory (0700, an unpredictable name), removed
        // when the launcher ends, however it ends.
        let dir = tempfile::Builder::new()
            .prefix("mlx-spec-launch-")
            .tempdir()
            .context("creating the hostfile's directory")?;
        let path = dir.path().join("ring.json");
        ring.write(&path)?;
        let secret = PipelineSecret::generate()?.to_hex();
        // Unless the user chose, the local ranks share out the cores.
        let blas = std::env::var_os(BLAS_THREADS_ENV)
            .is_none()
            .then(|| blas_threads(n).to_string());
        let stop = stop_on_signal();
        let children = (0..n)
            .map(|rank| {
                let mut cmd = Command::new(&exe);
                cmd.args(&args.command)
                    .env(RANK_ENV, rank.to_string())
                    .env(HOSTFILE_ENV, &path)
                    .env(JOIN_TIMEOUT_ENV, args.join_timeout.to_string())
                    .env(SECRET_ENV, &secret);
                if let Some(threads) = &blas {
                    cmd.env(BLAS_THREADS_ENV, threads);
                }
                spawn_rank(cmd, rank, None)
            })
            .collect::<Result<Vec<_>>>();
        let result = children.and_then(|children| watch(children, &stop));
        if let Err(e) = dir.close() {
            tracing::warn!(error = %e, "removing the hostfile's directory");
        }
        return result;
    }
    let Some(hosts_path) = &args.hosts else {
        bail!("give --np N (ranks on this machine) or --hosts FILE");
    };
    let hosts = read_hosts(hosts_path)?;
    let ranks = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            Ok(vec![SocketAddr::new(
                h.ips[0],
                port_of(args.starting_port.max(1), i)?,
            )])
        })
        .collect::<Result<_>>()?;
    let ring = Hostfile { ranks };
    let json = ring.to_json();
    let secret = PipelineSecret::generate()?.to_hex();
    let remote = |rank: usize| remote_command(rank, &args, &exe, &json);
    if !args.ssh {
        match &args.hostfile_path {
            Some(path) => println!(
                "# ring hostfile, written to {} on every host:",
                path.display()
            ),
            None => println!("# ring hostfile, written to a private `mktemp -d` on every host:"),
        }
        println!("{json}");
        println!(
            "# every rank's command first reads the job's secret from its stdin \
             (paste this line): {secret}"
        );
        for (rank, h) in hosts.iter().enumerate() {
            println!("# rank {rank} on {}:", h.ssh);
            println!("{}", remote(rank));
        }
        return Ok(());
    }
    let stop = stop_on_signal();
    let children = hosts
        .iter()
        .enumerate()
        .map(|(rank, h)| {
            let mut cmd = Command::new(&args.ssh_program);
            cmd.arg(&h.ssh).arg(remote(rank));
            // The secret goes down ssh's stdin, never on a command line.
            spawn_rank(cmd, rank, Some(&secret))
        })
        .collect::<Result<Vec<_>>>()?;
    watch(children, &stop)
}

/// The shell command a host runs for `rank`: read the secret from stdin
/// (into the environment, off every command line), write the hostfile (by
/// default into a fresh `mktemp -d`, which the rank removes once joined),
/// then become the rank.
fn remote_command(rank: usize, args: &Args, exe: &Path, json: &str) -> String {
    let (prepare, hostfile, dir) = match &args.hostfile_path {
        Some(path) => {
            let path = shell_quote(&path.display().to_string());
            (String::new(), path, None)
        }
        None => (
            "d=$(mktemp -d) && ".to_string(),
            "\"$d/ring.json\"".to_string(),
            Some("\"$d\""),
        ),
    };
    let mut words = vec![
        "env".to_string(),
        format!("{RANK_ENV}={rank}"),
        format!("{HOSTFILE_ENV}={hostfile}"),
    ];
    if let Some(dir) = dir {
        words.push(format!("{HOSTFILE_DIR_ENV}={dir}"));
    }
    words.push(format!("{JOIN_TIMEOUT_ENV}={}", args.join_timeout));
    words.push(shell_quote(&exe.display().to_string()));
    words.extend(args.command.iter().map(|w| shell_quote(w)));
    format!(
        "IFS= read -r {SECRET_ENV} && export {SECRET_ENV} && {prepare}\
         printf '%s' {} > {hostfile} && exec {}",
        shell_quote(json),
        words.join(" ")
    )
}

/// A flag set when the launcher gets SIGINT or SIGTERM (watched on a thread
/// of its own; without it the default action would end the launcher and
/// leave its ranks running).
fn stop_on_signal() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = Arc::clone(&flag);
    let kinds = [SignalKind::interrupt(), SignalKind::terminate()];
    signals::watch("launch-signals", &kinds, move |_| {
        set.store(true, Ordering::SeqCst);
        ControlFlow::Break(())
    });
    flag
}

/// Sends SIGTERM to a rank's process (`kill`: std sends only SIGKILL).
fn terminate(child: &Child) {
    let pid = child.id().to_string();
    match Command::new("kill").args(["-TERM", &pid]).status() {
        Ok(status) if status.success() => {}
        outcome => tracing::warn!(?outcome, pid, "passing SIGTERM to rank 0 failed"),
    }
}

fn port_of(start: u16, rank: usize) -> Result<u16> {
    u16::try_from(rank)
        .ok()
        .and_then(|r| start.checked_add(r))
        .with_context(|| format!("port {start} + rank {rank} is past 65535"))
}

/// `word` quoted for a POSIX shell.
fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// A started rank: rank 0 talks to the user (stdout and stderr inherited);
/// the others' stdout is dropped and their stderr relayed with a prefix.
struct Rank {
    rank: usize,
    child: Child,
}

/// Starts a rank; `stdin_line`, if given, is written to its stdin, which
/// is then closed (how a remote rank gets the secret).
fn spawn_rank(mut cmd: Command, rank: usize, stdin_line: Option<&str>) -> Result<Rank> {
    if rank > 0 {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    }
    // Signals reach the ranks through the launcher only (see
    // `stop_on_signal`), not from the terminal's process group; no rank
    // reads the terminal (one outside its foreground group would be
    // stopped for it).
    cmd.stdin(match stdin_line {
        Some(_) => Stdio::piped(),
        None => Stdio::null(),
    })
    .process_group(0);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting rank {rank}"))?;
    if let (Some(line), Some(mut stdin)) = (stdin_line, child.stdin.take()) {
        use std::io::Write;
        // Dropping `stdin` closes it: the rank reads no terminal.
        if let Err(e) = writeln!(stdin, "{line}") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e).with_context(|| format!("passing the secret to rank {rank}"));
        }
    }
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprint_whole(format_args!("[rank {rank}] {line}"));
            }
        });
    }
    Ok(Rank { rank, child })
}

/// Writes `line` and a newline to standard error in one `write`: the ranks
/// share the launcher's stderr, and `eprintln!` writes each piece of its
/// format apart, so two processes' lines interleaved mid-line ("[rank rank
/// 20] of 3"). One write of under `PIPE_BUF` bytes to a pipe is atomic.
pub(crate) fn eprint_whole(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Waits for every rank. The first that fails (or rank 0 ending while the
/// others run on past a grace period) stops all the others; the error
/// names it. Once `stop` is set, rank 0 gets SIGTERM and the job has the
/// grace period to end.
fn watch(mut ranks: Vec<Rank>, stop: &AtomicBool) -> Result<()> {
    const GRACE: Duration = Duration::from_secs(10);
    let mut stopping: Option<Instant> = None;
    let mut done: Vec<Option<ExitStatus>> = vec![None; ranks.len()];
    // Failed ranks in the order they were seen to end. Which one that is
    // first is a race: a failing rank's sockets close before its process is
    // reaped, so a peer that lost it can be seen to end first. Once one
    // fails, the others get `SETTLE` to end on their own and every failure
    // seen by then is named.
    const SETTLE: Duration = Duration::from_secs(1);
    let mut failed: Vec<String> = Vec::new();
    let mut first_failure: Option<Instant> = None;
    let mut rank0_done: Option<Instant> = None;
    let failure = loop {
        for r in ranks.iter_mut() {
            if done[r.rank].is_none() {
                if let Some(status) = r.child.try_wait().context("waiting for a rank")? {
                    done[r.rank] = Some(status);
                    if !status.success() {
                        failed.push(format!("rank {} ({status})", r.rank));
                    }
                }
            }
        }
        if !failed.is_empty() {
            let since = *first_failure.get_or_insert_with(Instant::now);
            if done.iter().all(Option::is_some) || since.elapsed() > SETTLE {
                break Some(format!("{} failed", failed.join(", then ")));
            }
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if done.iter().all(Option::is_some) {
            break None;
        }
        if stopping.is_none() && stop.load(Ordering::SeqCst) {
            stopping = Some(Instant::now());
            if let (Some(head), None) = (ranks.first(), done[0]) {
                terminate(&head.child);
            }
        }
        if stopping.is_some_and(|since| since.elapsed() > GRACE) {
            break Some(format!(
                "asked to stop, the ranks did not end within {GRACE:?}"
            ));
        }
        if done[0].is_some() {
            let since = *rank0_done.get_or_insert_with(Instant::now);
            if since.elapsed() > GRACE {
                let running: Vec<String> = done
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.is_none())
                    .map(|(i, _)| i.to_string())
                    .collect();
                break Some(format!(
                    "rank 0 finished but rank(s) {} still ran {GRACE:?} later",
                    running.join(", ")
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    for r in ranks.iter_mut() {
        if done[r.rank].is_none() {
            let _ = r.child.kill();
        }
        let _ = r.child.wait();
    }
    match failure {
        Some(why) => bail!("{why}; stopped every other rank"),
        None => Ok(()),
    }
}

/// `mlx-spec distributed-check`.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// Bytes each rank contributes to the timed all_sum.
    #[arg(long, default_value_t = 1 << 20)]
    bytes: usize,
    /// Fault injection for tests: this rank exits with status 3 after joining.
    #[arg(long, hide = true)]
    exit_rank: Option<usize>,
}

/// Joins the group the launcher set up, checks a sum and a relay around the
/// ring, times an all_sum, and reports on rank 0.
pub fn check(args: CheckArgs) -> Result<()> {
    use mlx_rs::Array;
    let group = mlx_distributed::init(&join_options())?;
    joined();
    let (rank, n) = (group.rank(), group.size());
    if args.exit_rank == Some(rank) {
        std::process::exit(3);
    }
    let sum = group.all_sum(&Array::from_slice(&[rank as f32 + 1.0], &[1]))?;
    sum.eval()?;
    let want = (n * (n + 1) / 2) as f32;
    if sum.as_slice::<f32>() != [want] {
        bail!(
            "rank {rank}: all_sum gave {:?}, expected {want}",
            sum.as_slice::<f32>()
        );
    }
    let mut token = Array::from_slice(&[0i32], &[1]);
    if n > 1 {
        if rank > 0 {
            token = group.recv_like(&token, rank - 1)?;
        }
        token = token.add(Array::from_int(rank as i32 + 1))?;
        group.send(&token, (rank + 1) % n)?.eval()?;
        if rank == 0 {
            token = group.recv_like(&token, n - 1)?;
            token.eval()?;
            let want = (n * (n + 1) / 2) as i32;
            if token.as_slice::<i32>() != [want] {
                bail!(
                    "relay came back as {:?}, expected {want}",
                    token.as_slice::<i32>()
                );
            }
        }
    }
    let floats = (args.bytes / 4).max(1);
    let x = mlx_rs::ops::ones::<f32>(&[floats as i32])?;
    x.eval()?;
    let start = Instant::now();
    let y = group.all_sum(&x)?;
    y.eval()?;
    let seconds = start.elapsed().as_secs_f64();
    if rank == 0 {
        println!(
            "group of {n} rank(s) over {}: all_sum and relay ok; all_sum of {} bytes in {:.2} ms",
            group.backend(),
            floats * 4,
            seconds * 1e3
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(shell_quote("generate"), "generate");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn local_ranks_share_the_cores_out() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(blas_threads(1), cores);
        assert_eq!(blas_threads(cores + 1), 1, "at least one each");
        assert_eq!(blas_threads(2), (cores / 2).max(1));
    }

    #[test]
    fn ports_past_the_range_are_refused() {
        assert_eq!(port_of(65534, 1).expect("fits"), 65535);
        assert!(port_of(65535, 1).is_err());
    }
}
