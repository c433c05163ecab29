//! Running the run binaries (the examples the gates and benches drive)
//! through `run-protocol`: the request goes to `STEM.request.json`, the
//! binary's one argument; its report, read from standard output, is saved
//! to `STEM.json` and parsed with the request's report type.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use run_protocol::Request;

use crate::shell;

/// `STEM.request.json`.
pub fn request_file(stem: &Path) -> PathBuf {
    with_suffix(stem, ".request.json")
}

/// `STEM.json`.
pub fn report_file(stem: &Path) -> PathBuf {
    with_suffix(stem, ".json")
}

/// `path` with `suffix` appended to its last component.
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Runs `R::BINARY` from this process's build (see [`shell::profile`]).
pub fn example<R: Request>(request: &R, stem: &Path, env: &[(&str, &str)]) -> Result<R::Report> {
    run(shell::example(R::BINARY), request, stem, env)
}

fn run<R: Request>(
    mut cmd: Command,
    request: &R,
    stem: &Path,
    env: &[(&str, &str)],
) -> Result<R::Report> {
    let (request_path, report_path) = (request_file(stem), report_file(stem));
    if let Some(dir) = stem.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&request_path, run_protocol::request_json(request))
        .with_context(|| format!("writing {}", request_path.display()))?;
    let _ = std::fs::remove_file(&report_path);
    cmd.arg(&request_path)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let shown = shell::render(&cmd);
    eprintln!("$ {shown}");
    let out = cmd
        .output()
        .with_context(|| format!("starting `{shown}`"))?;
    std::fs::write(&report_path, &out.stdout)
        .with_context(|| format!("writing {}", report_path.display()))?;
    if !out.status.success() {
        bail!("`{shown}` failed ({})", out.status);
    }
    let text = String::from_utf8(out.stdout)
        .with_context(|| format!("{}: the report is not UTF-8", R::BINARY))?;
    Ok(run_protocol::parse_report::<R>(
        &report_path.display().to_string(),
        &text,
    )?)
}

/// How many gate runs [`parallel`] keeps going at once: `MLX_SPEC_GATE_JOBS`
/// where set (1 runs them one after another), else the machine's cores, at
/// most 4. The gates' synthetic models are too small to keep even one core
/// busy in BLAS (two of them side by side on 2 cores take 0.53x of their
/// time one after the other); a run's numerics depend on its own
/// `OPENBLAS_NUM_THREADS`, never on what runs beside it.
pub fn gate_jobs() -> Result<usize> {
    match std::env::var("MLX_SPEC_GATE_JOBS") {
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => bail!("MLX_SPEC_GATE_JOBS={text:?}: expected a whole number of at least 1"),
        },
        Err(_) => Ok(std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(4)),
    }
}

/// A job of [`parallel`].
pub type Job<'a, T> = Box<dyn FnOnce() -> Result<T> + Send + 'a>;

/// [`parallel`], the jobs marked long started first (one started last would
/// run alone at the end); their results still in the order given.
pub fn parallel_long_first<'a, T: Send>(jobs: Vec<(bool, Job<'a, T>)>) -> Result<Vec<Result<T>>> {
    Ok(long_first_in(gate_jobs()?, jobs))
}

fn long_first_in<'a, T: Send>(width: usize, jobs: Vec<(bool, Job<'a, T>)>) -> Vec<Result<T>> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| !jobs[i].0);
    let mut slots: Vec<Option<Job<'a, T>>> = jobs.into_iter().map(|(_, j)| Some(j)).collect();
    let started = order.iter().filter_map(|&i| slots[i].take()).collect();
    let mut results: Vec<Option<Result<T>>> = order.iter().map(|_| None).collect();
    for (&i, result) in order.iter().zip(parallel_in(width, started)) {
        results[i] = Some(result);
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a gate job did not report"))))
        .collect()
}

/// Runs `jobs` at most [`gate_jobs`] at a time (each on its own thread,
/// most of them starting a run binary and waiting for it), started in the
/// order given; their results in that order. Only for gates: a benchmark's
/// runs must have the machine to themselves.
pub fn parallel<'a, T: Send>(jobs: Vec<Job<'a, T>>) -> Result<Vec<Result<T>>> {
    Ok(parallel_in(gate_jobs()?, jobs))
}

/// [`parallel`] `width` at a time. A job that panics fails in its place.
fn parallel_in<'a, T: Send>(width: usize, jobs: Vec<Job<'a, T>>) -> Vec<Result<T>> {
    let count = jobs.len();
    let width = width.min(count).max(1);
    let queue = std::sync::Mutex::new(jobs.into_iter().enumerate());
    let done = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..width {
            scope.spawn(|| loop {
                // The lock is held only to take the next job.
                let next = queue.lock().map(|mut q| q.next());
                let Ok(Some((i, job))) = next else { break };
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the job panicked")));
                if let Ok(mut done) = done.lock() {
                    done.push((i, result));
                }
            });
        }
    });
    let mut slots: Vec<Option<Result<T>>> = (0..count).map(|_| None).collect();
    for (i, result) in done.into_inner().unwrap_or_default() {
        slots[i] = Some(result);
    }
    slots
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a gate job did not report"))))
        .collect()
}

/// Reads a report `R`'s binary, or an oracle writing the same type, saved
/// at `path`.
pub fn read_report<R: Request>(path: &Path) -> Result<R::Report> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(run_protocol::parse_report::<R>(
        &path.display().to_string(),
        &text,
    )?)
}

#[cfg(test)]
mod tests {
    use run_protocol::Request;

    /// Every job runs once and its result comes back in its place, errors
    /// included, whatever order they finish in.
    #[test]
    fn parallel_keeps_each_result_in_its_place() {
        let jobs: Vec<Box<dyn FnOnce() -> anyhow::Result<usize> + Send>> = (0..9usize)
            .map(|i| {
                Box::new(move || {
                    std::thread::sleep(std::time::Duration::from_millis(((9 - i) * 3) as u64));
                    if i == 4 {
                        anyhow::bail!("job {i} failed")
                    }
                    Ok(i * 10)
                }) as Box<dyn FnOnce() -> anyhow::Result<usize> + Send>
            })
            .collect();
        let results = super::parallel_in(3, jobs);
        assert_eq!(results.len(), 9);
        for (i, r) in results.iter().enumerate() {
            match r {
                Ok(v) => assert_eq!(*v, i * 10),
                Err(e) => assert_eq!((i, e.to_string()), (4, "job 4 failed".to_owned())),
            }
        }
    }

    /// Long jobs start first; each result still comes back in its place.
    #[test]
    fn long_jobs_start_first_and_results_keep_their_places() {
        let started = std::sync::Mutex::new(Vec::new());
        let jobs: Vec<(bool, super::Job<usize>)> = (0..6usize)
            .map(|i| {
                let started = &started;
                (
                    i % 3 == 2,
                    Box::new(move || {
                        started.lock().expect("not poisoned").push(i);
                        Ok(i)
                    }) as super::Job<usize>,
                )
            })
            .collect();
        let results = super::long_first_in(1, jobs);
        let results: Vec<usize> = results.into_iter().map(|r| r.expect("ok")).collect();
        assert_eq!(results, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(
            *started.lock().expect("not poisoned"),
            vec![2, 5, 0, 1, 3, 4]
        );
    }

    /// Every request type names an example some crate has (the list is
    /// every `impl Request` of `run-protocol`).
    #[test]
    fn every_protocol_binary_is_an_example() {
        use run_protocol::{assistant, dflash, dspark, eagle3, gguf, greedy, invariance, mtp};
        use run_protocol::{prompt_cache, spec, structured, suffix, timing};
        let binaries = [
            spec::SpecRequest::BINARY,
            greedy::ParityRequest::BINARY,
            invariance::InvarianceRequest::BINARY,
            prompt_cache::PromptCacheRequest::BINARY,
            mtp::MtpRequest::BINARY,
            mtp::QwenMtpRequest::BINARY,
            dspark::DsparkRequest::BINARY,
            dflash::DflashRequest::BINARY,
            eagle3::Eagle3Request::BINARY,
            structured::StructuredRequest::BINARY,
            assistant::StepRequest::BINARY,
            assistant::RoundRequest::BINARY,
            gguf::GgufRequest::BINARY,
            timing::BatchTimeRequest::BINARY,
            timing::WindowTimeRequest::BINARY,
            suffix::TrieRequest::BINARY,
            suffix::CacheRequest::BINARY,
        ];
        // The engine crates' examples and the cross-crate ones (`tests/`).
        let root = crate::shell::root();
        let examples: Vec<String> = std::fs::read_dir(root.join("crates"))
            .expect("crates/")
            .flatten()
            .map(|c| c.path())
            .chain([root.join("tests")])
            .filter_map(|c| std::fs::read_dir(c.join("examples")).ok())
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".rs")
                    .map(str::to_owned)
            })
            .collect();
        for binary in binaries {
            assert!(
                examples.iter().any(|e| e == binary),
                "no example {binary}.rs"
            );
        }
    }
}
