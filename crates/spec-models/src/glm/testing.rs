//! Tiny random `glm_moe_dsa` checkpoints for tests (feature `test-support`):
//! the one GLM layout of `spec_fixtures::glm`, whose `Default` is the tiny
//! test size (the gates write the same layout at gate size).

pub use spec_fixtures::glm::Glm as TinyGlm;
