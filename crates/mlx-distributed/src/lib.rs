//! MLX's distributed layer (`mx.distributed`) for Rust: choose a backend,
//! join the group of processes it connects, and exchange arrays through
//! collectives (`all_sum`, `all_gather`, `all_max`, `all_min`,
//! `sum_scatter`) and point-to-point operations (`send`, `recv`,
//! `recv_like`). Operations are lazy MLX arrays like any other: the
//! communication happens when they are evaluated.
//!
//! mlx-rs has no distributed API; this crate calls mlx-c's functions (bound
//! by our `mlx-sys`) and turns MLX's failures into [`DistError`]s. The ring
//! backend (TCP, built into the Linux `mlx-cpu` wheel) reads its rank from
//! `MLX_RANK` and its peers from the JSON hostfile named by `MLX_HOSTFILE`
//! ([`Hostfile`]); MLX's own initialisation waits for every peer without a
//! limit, so [`init`] waits for it on a helper thread, at most
//! [`InitOptions::timeout`], and then names the peers that never answered.
//!
//! ```no_run
//! use mlx_distributed::{init, Backend, InitOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let group = init(&InitOptions::new(Backend::Ring))?;
//! let x = mlx_rs::Array::from_slice(&[group.rank() as f32], &[1]);
//! let total = group.all_sum(&x)?;
//! total.eval()?;
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod backend;
mod error;
mod ffi;
mod group;
mod hostfile;
mod init;

pub use backend::Backend;
pub use error::DistError;
pub use group::Group;
pub use hostfile::{Hostfile, HOSTFILE_ENV, RANK_ENV};
pub use init::{init, is_available, InitOptions};
