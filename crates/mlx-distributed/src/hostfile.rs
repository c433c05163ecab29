//! The ring backend's hostfile: a JSON list with one entry per rank, each a
//! list of `"ip:port"` addresses that rank listens on (MLX opens one
//! connection per address between neighbours).

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

use crate::DistError;

/// The environment variable that names the hostfile.
pub const HOSTFILE_ENV: &str = "MLX_HOSTFILE";
/// The environment variable that gives this process's rank.
pub const RANK_ENV: &str = "MLX_RANK";

/// A parsed ring hostfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostfile {
    /// Each rank's addresses, rank 0 first.
    pub ranks: Vec<Vec<SocketAddr>>,
}

fn bad(path: Option<&Path>, reason: impl Into<String>) -> DistError {
    DistError::Hostfile {
        path: path.map(Path::to_path_buf),
        reason: reason.into(),
    }
}

impl Hostfile {
    /// Parses hostfile text; `path` only names the file in errors.
    pub fn parse(text: &str, path: Option<&Path>) -> Result<Self, DistError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|source| DistError::HostfileJson {
                path: path.map(Path::to_path_buf),
                source,
            })?;
        let entries = value
            .as_array()
            .ok_or_else(|| bad(path, "expected a JSON list with one entry per rank"))?;
        if entries.is_empty() {
            return Err(bad(path, "lists no rank"));
        }
        let mut ranks = Vec::with_capacity(entries.len());
        for (rank, entry) in entries.iter().enumerate() {
            let addrs = entry.as_array().ok_or_else(|| {
                bad(
                    path,
                    format!("rank {rank}: expected a list of \"ip:port\" strings"),
                )
            })?;
            if addrs.is_empty() {
                return Err(bad(path, format!("rank {rank}: lists no address")));
            }
            let addrs = addrs
                .iter()
                .map(|a| {
                    let s = a.as_str().ok_or_else(|| {
                        bad(path, format!("rank {rank}: address {a} is not a string"))
                    })?;
                    s.parse::<SocketAddr>().map_err(|e| {
                        bad(
                            path,
                            format!("rank {rank}: `{s}` is not an ip:port address ({e})"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            if addrs.len() != ranks.first().map_or(addrs.len(), Vec::len) {
                return Err(bad(
                    path,
                    format!("rank {rank} lists {} addresses, rank 0 lists {}: every rank needs the same count", addrs.len(), ranks.first().map_or(0, Vec::len)),
                ));
            }
            ranks.push(addrs);
        }
        let mut seen = std::collections::HashSet::new();
        for (rank, addrs) in ranks.iter().enumerate() {
            for a in addrs {
                if !seen.insert(*a) {
                    return Err(bad(
                        path,
                        format!("rank {rank}: address {a} is listed twice"),
                    ));
                }
            }
        }
        Ok(Self { ranks })
    }

    /// Reads and parses a hostfile.
    pub fn read(path: &Path) -> Result<Self, DistError> {
        let text = std::fs::read_to_string(path).map_err(|source| DistError::Io {
            what: format!("ring hostfile {}: cannot be read", path.display()),
            source,
        })?;
        Self::parse(&text, Some(path))
    }

    /// The hostfile `MLX_HOSTFILE` names and the rank `MLX_RANK` gives,
    /// checked against each other.
    pub fn from_env() -> Result<(Self, usize, PathBuf), DistError> {
        let path = std::env::var_os(HOSTFILE_ENV)
            .map(PathBuf::from)
            .ok_or_else(|| bad(None, format!("{HOSTFILE_ENV} is not set")))?;
        let file = Self::read(&path)?;
        let rank = std::env::var(RANK_ENV)
            .map_err(|_| bad(Some(&path), format!("{RANK_ENV} is not set")))?;
        let rank: usize = rank.trim().parse().map_err(|_| {
            bad(
                Some(&path),
                format!("{RANK_ENV}=`{rank}` is not a rank number"),
            )
        })?;
        if rank >= file.size() {
            return Err(bad(
                Some(&path),
                format!("{RANK_ENV}={rank} but the file lists {} ranks", file.size()),
            ));
        }
        Ok((file, rank, path))
    }

    /// Ranks listed.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// `n` ranks on 127.0.0.1, one free port each (ports the system handed
    /// out just now; another process could still take one before MLX binds it).
    pub fn loopback(n: usize) -> Result<Self, DistError> {
        let mut ranks = Vec::with_capacity(n);
        let mut held = Vec::with_capacity(n);
        for rank in 0..n {
            // Hold every listener until all ports are chosen so none repeats.
            let l = TcpListener::bind("127.0.0.1:0").and_then(|l| {
                let addr = l.local_addr()?;
                Ok((l, addr))
            });
            let (l, addr) = l.map_err(|source| DistError::Io {
                what: format!("rank {rank}: no free loopback port"),
                source,
            })?;
            held.push(l);
            ranks.push(vec![addr]);
        }
        Ok(Self { ranks })
    }

    /// The file's JSON text.
    pub fn to_json(&self) -> String {
        let ranks: Vec<Vec<String>> = self
            .ranks
            .iter()
            .map(|addrs| addrs.iter().map(ToString::to_string).collect())
            .collect();
        serde_json::Value::from(ranks).to_string()
    }

    /// Writes the file.
    pub fn write(&self, path: &Path) -> Result<(), DistError> {
        std::fs::write(path, self.to_json()).map_err(|source| DistError::Io {
            what: format!("ring hostfile {}: cannot be written", path.display()),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_file_round_trips() {
        let f = Hostfile::loopback(3).expect("ports");
        assert_eq!(f.size(), 3);
        assert_eq!(Hostfile::parse(&f.to_json(), None).expect("parse"), f);
    }

    #[test]
    fn malformed_files_are_refused_naming_the_problem() {
        let cases = [
            ("{}", "one entry per rank"),
            ("[]", "no rank"),
            ("[[\"127.0.0.1:1\"], \"x\"]", "rank 1: expected a list"),
            ("[[\"localhost\"]]", "`localhost` is not an ip:port"),
            ("[[\"127.0.0.1:1\"], []]", "rank 1: lists no address"),
            ("[[\"127.0.0.1:1\"], [\"127.0.0.1:1\"]]", "listed twice"),
            (
                "[[\"127.0.0.1:1\", \"127.0.0.1:2\"], [\"127.0.0.1:3\"]]",
                "same count",
            ),
            ("[[1]]", "is not a string"),
            ("[[", "not JSON"),
        ];
        for (text, want) in cases {
            let err = Hostfile::parse(text, Some(Path::new("h.json"))).expect_err(text);
            let msg = err.to_string();
            assert!(
                msg.contains(want) && msg.contains("h.json"),
                "{text}: {msg}"
            );
        }
    }
}
