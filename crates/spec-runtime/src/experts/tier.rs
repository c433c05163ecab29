//! The resident tier: experts read from disk, kept up to a byte budget,
//! the least recently used evicted first; and its counters.

use std::collections::{BTreeMap, HashMap};

use crate::stacked::Stacked;

/// An expert's three projections (`gate`, `up`, `down`), each a stack of
/// one, converted as the load's dtype policy says (a clone shares the
/// arrays).
#[derive(Debug, Clone)]
pub struct ResidentExpert {
    /// `gate_proj`.
    pub gate: Stacked,
    /// `up_proj`.
    pub up: Stacked,
    /// `down_proj`.
    pub down: Stacked,
}

impl ResidentExpert {
    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.gate.nbytes() + self.up.nbytes() + self.down.nbytes()
    }
}

/// A streamed expert: the layer's index in the store and the expert id.
pub(super) type Key = (usize, u32);

/// What the tier has done since the store opened.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExpertStats {
    /// Experts a forward needed that were resident.
    pub hits: u64,
    /// Experts a forward needed that were read from disk.
    pub misses: u64,
    /// Bytes read from the checkpoint's shards.
    pub bytes_read: u64,
    /// Seconds the reader threads spent reading experts (summed over
    /// threads: reads overlap).
    pub read_seconds: f64,
    /// Seconds forwards waited for reads after dispatching what they could
    /// (and turning the bytes into arrays): what reading cost the engine.
    pub wait_seconds: f64,
    /// Bytes the tier holds now.
    pub resident_bytes: u64,
    /// The tier's budget in bytes.
    pub capacity_bytes: u64,
}

#[derive(Debug)]
struct Entry {
    expert: ResidentExpert,
    bytes: usize,
    tick: u64,
}

/// Least-recently-used experts under a byte budget.
#[derive(Debug)]
pub(super) struct Tier {
    capacity: usize,
    entries: HashMap<Key, Entry>,
    /// Entries by last use (tick -> key).
    order: BTreeMap<u64, Key>,
    tick: u64,
    resident: usize,
    pub stats: ExpertStats,
}

impl Tier {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            resident: 0,
            stats: ExpertStats {
                capacity_bytes: capacity as u64,
                ..ExpertStats::default()
            },
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The resident expert `key`, marked as just used.
    pub fn get(&mut self, key: Key) -> Option<ResidentExpert> {
        self.tick += 1;
        let tick = self.tick;
        let entry = self.entries.get_mut(&key)?;
        self.order.remove(&entry.tick);
        entry.tick = tick;
        self.order.insert(tick, key);
        self.stats.hits += 1;
        Some(entry.expert.clone())
    }

    /// Keeps `expert` resident, evicting the least recently used until it
    /// fits (an expert larger than the budget was refused when its layer
    /// registered).
    pub fn insert(&mut self, key: Key, expert: ResidentExpert) {
        let bytes = expert.nbytes();
        if let Some(old) = self.entries.remove(&key) {
            self.order.remove(&old.tick);
            self.resident -= old.bytes;
        }
        while self.resident + bytes > self.capacity {
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            if let Some(old) = self.entries.remove(&victim) {
                self.resident -= old.bytes;
            }
        }
        self.tick += 1;
        self.order.insert(self.tick, key);
        self.entries.insert(
            key,
            Entry {
                expert,
                bytes,
                tick: self.tick,
            },
        );
        self.resident += bytes;
        self.stats.resident_bytes = self.resident as u64;
    }

    /// The stats, resident bytes current.
    pub fn stats(&self) -> ExpertStats {
        ExpertStats {
            resident_bytes: self.resident as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacked::Stored;
    use crate::DtypePolicy;

    fn expert(values: i32) -> ResidentExpert {
        let s = || {
            let w = mlx_rs::ops::zeros::<f32>(&[1, values, 1]).expect("zeros");
            Stacked::from_stored(Stored::Dense(w), DtypePolicy::Keep).expect("stacked")
        };
        ResidentExpert {
            gate: s(),
            up: s(),
            down: s(),
        }
    }

    /// Each expert of `expert(2)` holds 24 bytes; a 60-byte tier keeps two.
    #[test]
    fn the_least_recently_used_expert_goes_first() {
        let mut tier = Tier::new(60);
        tier.insert((0, 1), expert(2));
        tier.insert((0, 2), expert(2));
        assert!(tier.get((0, 1)).is_some(), "1 used again");
        tier.insert((0, 3), expert(2));
        assert!(tier.get((0, 2)).is_none(), "2 was the least recent");
        assert!(tier.get((0, 1)).is_some());
        assert!(tier.get((0, 3)).is_some());
        let stats = tier.stats();
        assert_eq!(stats.resident_bytes, 48);
        assert_eq!(stats.hits, 3);
        tier.insert((1, 1), expert(2));
        assert!(tier.get((0, 1)).is_none(), "1 was the least recent now");
        assert_eq!(tier.stats().resident_bytes, 48);
    }
}
