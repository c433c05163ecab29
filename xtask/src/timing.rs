//! Wall-clock time of each step of `cargo xtask test` and of each gate,
//! printed as one table at the end so a slow step is easy to find
//! (`docs/TESTING.md` keeps the figures of a reference run).

use std::time::{Duration, Instant};

/// Steps in the order they ran, each with its duration.
#[derive(Debug, Default)]
pub struct Timings {
    rows: Vec<(String, Duration)>,
}

impl Timings {
    /// Runs `step`, recording how long it took under `name` whatever it returns.
    pub fn time<T>(&mut self, name: &str, step: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = step();
        self.rows.push((name.to_owned(), start.elapsed()));
        out
    }

    /// Adds the rows of another recorder (the gates' own) after ours.
    pub fn extend(&mut self, other: Timings) {
        self.rows.extend(other.rows);
    }

    /// The table: one line per step, then the total.
    pub fn render(&self) -> String {
        let width = self.rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (name, took) in &self.rows {
            out.push_str(&format!("{name:<width$}  {}\n", clock(*took)));
        }
        let total: Duration = self.rows.iter().map(|(_, d)| *d).sum();
        out.push_str(&format!("{:<width$}  {}\n", "total", clock(total)));
        out
    }
}

/// `m:ss`, the resolution that matters for a half-hour run.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:>3}:{:02}", s / 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lists_each_step_and_the_total() {
        let mut t = Timings::default();
        t.rows.push(("build".into(), Duration::from_secs(125)));
        t.rows.push(("gate parity".into(), Duration::from_secs(9)));
        assert_eq!(
            t.render(),
            "build          2:05\ngate parity    0:09\ntotal          2:14\n"
        );
        assert_eq!(t.time("x", || 7), 7);
        assert_eq!(t.rows.last().map(|r| r.0.as_str()), Some("x"));
    }
}
