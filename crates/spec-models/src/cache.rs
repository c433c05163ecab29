//! KV caches: `KvCache` grows in steps of 256 positions (as mlx-lm's does)
//! and trims exactly; `RotatingKvCache` keeps a sliding window and can be
//! trimmed only until it first drops a token.

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;
use spec_core::{LayerCache, SpecError};

const STEP: i32 = 256;

fn seq_len(a: &Array) -> i32 {
    a.shape().get(2).copied().unwrap_or(0)
}

/// A growable, exactly trimmable KV cache. A clone is a snapshot: later
/// updates of either copy never show in the other (MLX arrays are immutable;
/// an update replaces the buffer).
#[derive(Debug, Default, Clone)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cached rows, `[.., .., ..offset, ..]` of keys and values (`None`
    /// before the first update).
    pub fn contents(&self) -> Option<(Array, Array)> {
        let (k, v) = (self.keys.as_ref()?, self.values.as_ref()?);
        let end = self.offset as i32;
        Some((k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..))))
    }
}

fn grown(buffer: Option<&Array>, prev: i32, new: &Array) -> Result<Array, SpecError> {
    let shape = new.shape();
    let (b, h, l, d) = (shape[0], shape[1], shape[2], shape[3]);
    let steps = (STEP + l - 1) / STEP;
    let fresh = zeros_dtype(&[b, h, steps * STEP, d], new.dtype())?;
    Ok(match buffer {
        None => fresh,
        Some(old) => {
            let old = if prev % STEP != 0 {
                old.index((.., .., ..prev, ..))
            } else {
                old.clone()
            };
            concatenate(&[old, fresh], 2)?
        }
    })
}

impl KvCache {
    /// The cached keys and values, `[B, heads, offset, D]`, or `None` before
    /// the first update.
    pub fn state(&self) -> Option<(Array, Array)> {
        let (k, v) = (self.keys.as_ref()?, self.values.as_ref()?);
        let end = self.offset as i32;
        Some((k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..))))
    }
}

impl LayerCache for KvCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        if keys.ndim() != 4 || values.ndim() != 4 {
            return Err(SpecError::Invalid(format!(
                "KV cache expects [B, heads, L, D], got {:?} and {:?}",
                keys.shape(),
                values.shape()
            )));
        }
        let prev = self.offset as i32;
        let l = seq_len(keys);
        let needs_room = match &self.keys {
            None => true,
            Some(k) => prev + l > seq_len(k),
        };
        if needs_room {
            self.keys = Some(grown(self.keys.as_ref(), prev, keys)?);
            self.values = Some(grown(self.values.as_ref(), prev, values)?);
        }
        let end = prev + l;
        let (Some(k), Some(v)) = (self.keys.as_mut(), self.values.as_mut()) else {
            return Err(SpecError::Invalid("KV cache buffers missing".into()));
        };
        k.try_index_mut((.., .., prev..end, ..), keys)?;
        v.try_index_mut((.., .., prev..end, ..), values)?;
        self.offset = end as usize;
        if end < seq_len(k) {
            Ok((k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..))))
        } else {
            Ok((k.clone(), v.clone()))
        }
    }

    fn can_trim(&self, n: usize) -> bool {
        n <= self.offset
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if n > self.offset {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!("only {} tokens cached", self.offset),
            });
        }
        self.offset -= n;
        Ok(())
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Array::nbytes) + self.values.as_ref().map_or(0, Array::nbytes)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A sliding-window cache: keeps the last `window` positions in temporal
/// order. Trimming is exact until the first position falls out of the
/// window; after that `can_trim` is false (the dropped rows are gone).
#[derive(Debug)]
pub struct RotatingKvCache {
    window: usize,
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
}

impl RotatingKvCache {
    /// An empty cache keeping `window` positions.
    pub fn new(window: usize) -> Self {
        Self {
            window,
            keys: None,
            values: None,
            offset: 0,
        }
    }

    /// Absolute position of the first key the last `update_and_fetch` returned.
    pub fn first_position(&self, fetched: usize) -> usize {
        self.offset.saturating_sub(fetched)
    }
}

impl LayerCache for RotatingKvCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(
        &mut self,
        keys: &Array,
        values: &Array,
    ) -> Result<(Array, Array), SpecError> {
        let join = |old: &Option<Array>, new: &Array| -> Result<Array, SpecError> {
            Ok(match old {
                None => new.clone(),
                Some(o) => concatenate(&[o.clone(), new.clone()], 2)?,
            })
        };
        let all_k = join(&self.keys, keys)?;
        let all_v = join(&self.values, values)?;
        self.offset += seq_len(keys) as usize;
        let len = seq_len(&all_k);
        let keep = self.window as i32;
        if len > keep {
            self.keys = Some(all_k.index((.., .., len - keep.., ..)));
            self.values = Some(all_v.index((.., .., len - keep.., ..)));
        } else {
            self.keys = Some(all_k.clone());
            self.values = Some(all_v.clone());
        }
        Ok((all_k, all_v))
    }

    fn can_trim(&self, n: usize) -> bool {
        n <= self.offset && self.offset <= self.window
    }

    fn can_trim_after(&self, append: usize, n: usize) -> bool {
        n <= self.offset + append && self.offset + append <= self.window
    }

    fn trim(&mut self, n: usize) -> Result<(), SpecError> {
        if !self.can_trim(n) {
            return Err(SpecError::Trim {
                requested: n,
                reason: format!(
                    "sliding window of {} already rotated (offset {})",
                    self.window, self.offset
                ),
            });
        }
        let keep = (self.offset - n) as i32;
        self.keys = self.keys.as_ref().map(|k| k.index((.., .., ..keep, ..)));
        self.values = self.values.as_ref().map(|v| v.index((.., .., ..keep, ..)));
        self.offset -= n;
        Ok(())
    }

    fn window(&self) -> Option<usize> {
        Some(self.window)
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Array::nbytes) + self.values.as_ref().map_or(0, Array::nbytes)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(n: i32, fill: f32) -> Array {
        Array::from_slice(&vec![fill; (2 * n * 4) as usize], &[1, 2, n, 4])
    }

    #[test]
    fn kv_cache_grows_trims_and_overwrites() {
        let mut c = KvCache::new();
        let (k, _) = c
            .update_and_fetch(&step(3, 1.0), &step(3, 1.0))
            .expect("update");
        assert_eq!(k.shape(), &[1, 2, 3, 4]);
        c.update_and_fetch(&step(300, 2.0), &step(300, 2.0))
            .expect("grow past one step");
        assert_eq!(c.offset(), 303);
        c.trim(2).expect("trim");
        let (k, _) = c
            .update_and_fetch(&step(1, 9.0), &step(1, 9.0))
            .expect("after trim");
        assert_eq!(k.shape(), &[1, 2, 302, 4]);
        let last: Vec<f32> = k
            .index((.., .., 301.., ..))
            .flatten(None, None)
            .expect("flatten")
            .as_slice::<f32>()
            .to_vec();
        assert!(
            last.iter().all(|&v| v == 9.0),
            "trimmed rows are overwritten"
        );
        assert!(c.trim(400).is_err(), "cannot trim more than cached");
        assert_eq!(c.offset(), 302, "a failed trim changes nothing");
    }

    #[test]
    fn rotating_cache_reports_when_it_can_no_longer_trim() {
        let mut c = RotatingKvCache::new(4);
        c.update_and_fetch(&step(3, 1.0), &step(3, 1.0))
            .expect("update");
        assert!(c.can_trim(2));
        assert!(
            c.can_trim_after(1, 2) && !c.can_trim_after(2, 1),
            "appending past the window rotates it"
        );
        c.trim(1).expect("trim within window");
        assert_eq!(c.offset(), 2);
        c.update_and_fetch(&step(3, 2.0), &step(3, 2.0))
            .expect("update");
        assert_eq!(c.offset(), 5);
        assert!(!c.can_trim(1), "a rotated window cannot roll back");
        assert!(c.trim(1).is_err());
        let (k, _) = c
            .update_and_fetch(&step(1, 3.0), &step(1, 3.0))
            .expect("update");
        assert_eq!(k.shape(), &[1, 2, 5, 4], "the window plus the new token");
    }
}
