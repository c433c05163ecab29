//! Grammar-constrained decoding through llguidance: a request's JSON
//! schema, Lark grammar or regex compiled against the model's own
//! vocabulary into a [`spec_core::Constraint`] the serve loop drives.
//!
//! A [`TokenEnv`] is built once per model (it indexes the vocabulary and
//! holds llguidance's parser factory, the expensive part);
//! [`TokenEnv::constraint`] compiles one request's [`GrammarSpec`] into a
//! fresh [`GrammarConstraint`]. Compilation is bounded by
//! [`GrammarLimits`]: a grammar past them is a [`GrammarError`], never a
//! hang.
#![warn(missing_docs)]

mod constraint;
mod error;
mod schema_path;
mod spec;
mod token_env;

pub use constraint::GrammarConstraint;
pub use error::GrammarError;
pub use llguidance::api::ParserLimits;
pub use spec::{json_dumps_layout, with_default_layout, GrammarKind, GrammarSpec, LAYOUT_KEY};
pub use token_env::{GrammarLimits, TokenEnv};

#[cfg(test)]
mod tests;
