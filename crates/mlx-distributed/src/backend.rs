//! The backends MLX's distributed layer knows.

use std::fmt;
use std::str::FromStr;

use crate::DistError;

/// A communication backend of MLX, named as `mx.distributed.init` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The first backend that can initialise (MLX's order), else a
    /// single-process group when not strict.
    Any,
    /// TCP sockets between neighbouring ranks (`MLX_RANK`, `MLX_HOSTFILE`).
    Ring,
    /// MPI, when an MPI library can be loaded.
    Mpi,
    /// RDMA over Thunderbolt (macOS).
    Jaccl,
    /// NCCL (CUDA builds of MLX).
    Nccl,
}

impl Backend {
    /// Every backend, `Any` first.
    pub const ALL: [Backend; 5] = [
        Backend::Any,
        Backend::Ring,
        Backend::Mpi,
        Backend::Jaccl,
        Backend::Nccl,
    ];

    /// The name MLX takes.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Any => "any",
            Backend::Ring => "ring",
            Backend::Mpi => "mpi",
            Backend::Jaccl => "jaccl",
            Backend::Nccl => "nccl",
        }
    }

    pub(crate) fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            Backend::Any => c"any",
            Backend::Ring => c"ring",
            Backend::Mpi => c"mpi",
            Backend::Jaccl => c"jaccl",
            Backend::Nccl => c"nccl",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = DistError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| DistError::UnknownBackend(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for b in Backend::ALL {
            assert_eq!(b.name().parse::<Backend>().expect("known"), b);
            assert_eq!(b.c_name().to_str().expect("ascii"), b.name());
        }
        let err = "tcp".parse::<Backend>().expect_err("unknown");
        assert!(err.to_string().contains("`tcp`"), "{err}");
    }
}
