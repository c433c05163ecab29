//! A target whose forward fails on its k-th call (fault-injection
//! scenarios): before touching the caches, or after they took the rows
//! (the worst moment for rollback).

use std::cell::Cell;

use mlx_rs::Array;
use spec_core::{CacheSet, SpecError, Target, TargetInfo, TargetOutput};

/// `inner`, with its `fail_at`-th forward failing ("injected forward
/// failure").
#[derive(Debug)]
pub struct FailingTarget<'a> {
    inner: &'a dyn Target,
    fail_at: usize,
    after_caches: bool,
    calls: Cell<usize>,
}

impl<'a> FailingTarget<'a> {
    /// Fails forward `fail_at` (1-based) before it runs.
    pub fn new(inner: &'a dyn Target, fail_at: usize) -> Self {
        Self {
            inner,
            fail_at,
            after_caches: false,
            calls: Cell::new(0),
        }
    }

    /// Fails forward `fail_at` after it ran, the caches holding its rows.
    pub fn after_caches(inner: &'a dyn Target, fail_at: usize) -> Self {
        Self {
            after_caches: true,
            ..Self::new(inner, fail_at)
        }
    }
}

impl Target for FailingTarget<'_> {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }
    fn make_caches(&self) -> CacheSet {
        self.inner.make_caches()
    }
    fn forward(
        &self,
        tokens: &Array,
        caches: &mut CacheSet,
        taps: &[usize],
    ) -> Result<TargetOutput, SpecError> {
        self.calls.set(self.calls.get() + 1);
        if self.calls.get() == self.fail_at {
            if self.after_caches {
                self.inner.forward(tokens, caches, taps)?;
            }
            return Err(SpecError::Model("injected forward failure".into()));
        }
        self.inner.forward(tokens, caches, taps)
    }
    fn logits(&self, hidden: &Array) -> Result<Array, SpecError> {
        self.inner.logits(hidden)
    }
    fn embed(&self, tokens: &Array) -> Result<Array, SpecError> {
        self.inner.embed(tokens)
    }
    fn weights_bytes(&self) -> usize {
        self.inner.weights_bytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self.inner.as_any()
    }
}
