//! The runtime every architecture and drafter shares: configuration
//! (`config`), weight loading (`weights`, `stacked`; routed experts streamed
//! from disk: `experts`), layers and numerics
//! (`layers`, `rope`, `mask`, `sdpa`), caches (`cache`) and packed ragged
//! batches (`batch`), drafters' config key reader (`config_keys`),
//! tapped-target context, its draft/commit protocol and the block
//! drafters' source on it (`tap_context`, `tap_source`, `block_source`) and tapped drafters' config, fit and input errors
//! (`drafter_error`), with the errors they raise (`error`) and the options
//! every loader takes (`load_options`), and the memory the process can still
//! take (`host_memory`). It names no architecture.
#![warn(missing_docs)]

pub mod adapter;
pub mod batch;
pub mod block_source;
pub mod cache;
pub mod config;
pub mod config_keys;
pub mod drafter_error;
pub mod error;
pub mod experts;
pub mod host_memory;
pub mod layers;
pub mod load_options;
pub mod mask;
pub mod rope;
pub mod sdpa;
pub mod stacked;
pub mod switch_glu;
pub mod tap_context;
pub mod tap_source;
pub mod weights;

pub use error::ModelError;
pub use load_options::{DtypePolicy, LoadOptions, ProgressFn};
