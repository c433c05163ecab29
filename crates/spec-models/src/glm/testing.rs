//! Tiny random `glm_moe_dsa` checkpoints for tests (feature `test-support`):
//! the one GLM layout of `spec_fixtures::glm`, whose `Default` is the tiny
//! test size in GLM-5's schema and `glm52_tiny()` the same in GLM-5.2's
//! (IndexShare, the MTP row's indexer); the gates write the same layouts at
//! gate size.

pub use spec_fixtures::glm::Glm as TinyGlm;
