//! A bounded pool of reader threads: a forward hands it every expert read
//! its picks need at once, so the reads overlap one another (and whatever
//! compute the engine thread has dispatched meanwhile), and takes the
//! bytes back as they arrive. The threads only read files; arrays are made
//! on the engine thread.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Reader threads a store starts: several outstanding reads keep a disk's
/// queue busy, and more than this gains little from a page cache, whose
/// reads are copies bound by memory bandwidth.
pub const READERS: usize = 4;

type Job = Box<dyn FnOnce() + Send>;

/// The pool: `size` threads taking jobs from one queue. Dropping it lets
/// the queued jobs finish and joins the threads.
#[derive(Debug)]
pub(super) struct Readers {
    queue: Option<Mutex<Sender<Job>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Readers {
    /// Starts up to `size` threads; a thread that cannot start leaves the
    /// pool smaller, and a pool of none runs each job on the caller.
    pub fn new(size: usize) -> Self {
        let (queue, jobs) = channel::<Job>();
        let jobs = Arc::new(Mutex::new(jobs));
        let threads: Vec<_> = (0..size)
            .filter_map(|i| {
                let jobs = Arc::clone(&jobs);
                std::thread::Builder::new()
                    .name(format!("expert-reader-{i}"))
                    .spawn(move || work(&jobs))
                    .ok()
            })
            .collect();
        Self {
            queue: (!threads.is_empty()).then(|| Mutex::new(queue)),
            threads,
        }
    }

    /// Threads running.
    #[cfg(test)]
    pub fn size(&self) -> usize {
        self.threads.len()
    }

    /// Runs `job` on a reader thread (or here, when there is none).
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let job: Job = Box::new(job);
        let refused = match &self.queue {
            Some(queue) => {
                let queue = queue.lock().unwrap_or_else(|e| e.into_inner());
                queue.send(job).err().map(|e| e.0)
            }
            None => Some(job),
        };
        if let Some(job) = refused {
            job();
        }
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        self.queue = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A reader thread: jobs until the queue closes.
fn work(jobs: &Mutex<Receiver<Job>>) {
    loop {
        let next = {
            let jobs = jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.recv()
        };
        match next {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    /// Four jobs that each wait for all four to have started finish only
    /// if four threads run them at once.
    #[test]
    fn jobs_run_concurrently_on_the_pool_and_report_back() {
        let pool = Readers::new(4);
        assert_eq!(pool.size(), 4);
        let barrier = Arc::new(Barrier::new(4));
        let (done, finished) = channel::<usize>();
        for i in 0..4 {
            let (barrier, done) = (Arc::clone(&barrier), done.clone());
            pool.submit(move || {
                barrier.wait();
                let _ = done.send(i);
            });
        }
        drop(done);
        let mut got: Vec<usize> = finished.iter().collect();
        got.sort_unstable();
        assert_eq!(got, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_pool_of_none_runs_jobs_on_the_caller() {
        let pool = Readers::new(0);
        assert_eq!(pool.size(), 0);
        let (done, finished) = channel::<std::thread::ThreadId>();
        pool.submit(move || {
            let _ = done.send(std::thread::current().id());
        });
        assert_eq!(finished.recv().ok(), Some(std::thread::current().id()));
    }
}
