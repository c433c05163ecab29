//! Streaming parse of a safetensors JSON header. `serde_json::Value` would keep
//! the last of two equal keys and would materialise arbitrarily large arrays;
//! these visitors see every key (so duplicates are caught), keep only the few
//! values the checks need, and skip everything else without storing it.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::{GuardError, Limits};

/// The `visit_*` methods of a visitor that only accepts objects: every other
/// JSON type reports `self.not_object(description)`.
macro_rules! reject_non_objects {
    () => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Err(self.not_object("null"))
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Err(self.not_object("a boolean"))
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Err(self.not_object("a number"))
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Err(self.not_object("a number"))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(self.not_object("a number"))
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Err(self.not_object("a string"))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(self.not_object("an array"))
        }
    };
}

/// A JSON value kept only as far as the checks need it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Shallow {
    Null,
    Bool(bool),
    UInt(u64),
    NegInt(i64),
    Float(f64),
    Str(String),
    /// An array: its first elements (at most the seed's cap, each a scalar or
    /// `Other`) and its full length.
    Seq {
        items: Vec<Shallow>,
        len: u64,
    },
    /// An object, or an array inside an array: skipped, not kept.
    Other,
}

impl fmt::Display for Shallow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Null => f.write_str("null"),
            Self::Bool(b) => write!(f, "{b}"),
            Self::UInt(v) => write!(f, "{v}"),
            Self::NegInt(v) => write!(f, "{v}"),
            Self::Float(v) => write!(f, "{v:?}"),
            Self::Str(s) => write!(f, "{s:?}"),
            Self::Seq { len, .. } => write!(f, "an array of {len} elements"),
            Self::Other => f.write_str("an object or nested array"),
        }
    }
}

/// One tensor entry, each field as written (absent fields are `None`).
#[derive(Debug, Default)]
pub(crate) struct RawEntry {
    pub(crate) dtype: Option<Shallow>,
    pub(crate) shape: Option<Shallow>,
    pub(crate) data_offsets: Option<Shallow>,
}

/// The header: tensor entries by name and the `__metadata__` map.
#[derive(Debug, Default)]
pub(crate) struct RawHeader {
    pub(crate) entries: BTreeMap<String, RawEntry>,
    pub(crate) metadata: BTreeMap<String, String>,
}

/// Parses `text` (already known to be UTF-8 starting with `{`). Structural
/// problems (duplicates, wrong entry types, too many tensors) come back as
/// their own [`GuardError`] variants; anything else serde_json rejects is
/// `SafetensorsHeaderNotJson`.
pub(crate) fn parse_header(
    path: &Path,
    text: &str,
    limits: &Limits,
) -> Result<RawHeader, GuardError> {
    let ctx = Ctx {
        path,
        limits,
        problem: RefCell::new(None),
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = de
        .deserialize_map(HeaderVisitor { ctx: &ctx })
        .and_then(|header| de.end().map(|()| header));
    parsed.map_err(|json| {
        ctx.problem
            .take()
            .unwrap_or_else(|| GuardError::SafetensorsHeaderNotJson {
                path: path.to_path_buf(),
                message: json.to_string(),
            })
    })
}

/// What every visitor shares: where to report, and the first specific problem
/// found (serde's error type cannot carry our variants, so a visitor stores
/// the variant here and aborts the parse with a placeholder serde error).
struct Ctx<'a> {
    path: &'a Path,
    limits: &'a Limits,
    problem: RefCell<Option<GuardError>>,
}

impl Ctx<'_> {
    fn fail<E: de::Error>(&self, problem: GuardError) -> E {
        let mut slot = self.problem.borrow_mut();
        if slot.is_none() {
            *slot = Some(problem);
        }
        E::custom("safetensors header rejected")
    }

    fn path(&self) -> std::path::PathBuf {
        self.path.to_path_buf()
    }
}

struct HeaderVisitor<'a> {
    ctx: &'a Ctx<'a>,
}

impl<'de> Visitor<'de> for HeaderVisitor<'_> {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
        let ctx = self.ctx;
        let mut header = RawHeader::default();
        let mut seen_metadata = false;
        let mut tensors: u64 = 0;
        while let Some(key) = map.next_key::<String>()? {
            if key == "__metadata__" {
                if seen_metadata {
                    return Err(ctx.fail(GuardError::SafetensorsBadMetadata {
                        path: ctx.path(),
                        detail: "__metadata__ appears twice".into(),
                    }));
                }
                seen_metadata = true;
                header.metadata = map.next_value_seed(MetadataSeed { ctx })?;
                continue;
            }
            tensors += 1;
            if tensors > ctx.limits.max_tensors {
                return Err(ctx.fail(GuardError::SafetensorsTooManyTensors {
                    path: ctx.path(),
                    limit: ctx.limits.max_tensors,
                }));
            }
            if key.is_empty() {
                return Err(ctx.fail(GuardError::SafetensorsEmptyName { path: ctx.path() }));
            }
            if header.entries.contains_key(&key) {
                return Err(ctx.fail(GuardError::SafetensorsDuplicateName {
                    path: ctx.path(),
                    name: key,
                }));
            }
            let entry = map.next_value_seed(EntrySeed { ctx, name: &key })?;
            header.entries.insert(key, entry);
        }
        Ok(header)
    }
}

struct MetadataSeed<'a> {
    ctx: &'a Ctx<'a>,
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = BTreeMap<String, String>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        // MLX writes `"__metadata__": null` when a file has no metadata, and
        // the reference parser accepts it: null means empty.
        de.deserialize_option(OptionalMetadata { ctx: self.ctx })
    }
}

struct OptionalMetadata<'a> {
    ctx: &'a Ctx<'a>,
}

impl<'de> Visitor<'de> for OptionalMetadata<'_> {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("null or an object of string values")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_any(MetadataVisitor { ctx: self.ctx })
    }
}

struct MetadataVisitor<'a> {
    ctx: &'a Ctx<'a>,
}

impl MetadataVisitor<'_> {
    fn not_object<E: de::Error>(&self, found: &str) -> E {
        self.ctx.fail(GuardError::SafetensorsBadMetadata {
            path: self.ctx.path(),
            detail: format!("__metadata__ is {found}, not an object"),
        })
    }
}

impl<'de> Visitor<'de> for MetadataVisitor<'_> {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of string values")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let ctx = self.ctx;
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(ctx.fail(GuardError::SafetensorsBadMetadata {
                    path: ctx.path(),
                    detail: format!("key {key:?} appears twice"),
                }));
            }
            match map.next_value_seed(ShallowSeed::element())? {
                Shallow::Str(value) => {
                    out.insert(key, value);
                }
                other => {
                    return Err(ctx.fail(GuardError::SafetensorsBadMetadata {
                        path: ctx.path(),
                        detail: format!("value of {key:?} is {other}, not a string"),
                    }))
                }
            }
        }
        Ok(out)
    }

    reject_non_objects!();
}

struct EntrySeed<'a> {
    ctx: &'a Ctx<'a>,
    name: &'a str,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = RawEntry;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<RawEntry, D::Error> {
        de.deserialize_any(EntryVisitor {
            ctx: self.ctx,
            name: self.name,
        })
    }
}

struct EntryVisitor<'a> {
    ctx: &'a Ctx<'a>,
    name: &'a str,
}

impl EntryVisitor<'_> {
    fn not_object<E: de::Error>(&self, _found: &str) -> E {
        self.ctx.fail(GuardError::SafetensorsEntryNotObject {
            path: self.ctx.path(),
            tensor: self.name.to_owned(),
        })
    }
}

impl<'de> Visitor<'de> for EntryVisitor<'_> {
    type Value = RawEntry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tensor entry object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEntry, A::Error> {
        let ctx = self.ctx;
        let mut entry = RawEntry::default();
        while let Some(field) = map.next_key::<String>()? {
            // Shapes keep one element past the limit so the count can be
            // reported; offsets keep one past two so a third is noticed.
            let (slot, cap) = match field.as_str() {
                "dtype" => (&mut entry.dtype, 0),
                "shape" => (&mut entry.shape, ctx.limits.max_dims.saturating_add(1)),
                "data_offsets" => (&mut entry.data_offsets, 3),
                _ => {
                    return Err(ctx.fail(GuardError::SafetensorsUnknownField {
                        path: ctx.path(),
                        tensor: self.name.to_owned(),
                        field,
                    }))
                }
            };
            if slot.is_some() {
                return Err(ctx.fail(GuardError::SafetensorsDuplicateField {
                    path: ctx.path(),
                    tensor: self.name.to_owned(),
                    field,
                }));
            }
            *slot = Some(map.next_value_seed(ShallowSeed::top(cap))?);
        }
        Ok(entry)
    }

    reject_non_objects!();
}

/// Deserializes one value as a [`Shallow`], keeping at most `cap` array
/// elements (each itself shallow: arrays and objects inside are skipped).
#[derive(Clone, Copy)]
struct ShallowSeed {
    cap: usize,
    nested: bool,
}

impl ShallowSeed {
    fn top(cap: usize) -> Self {
        Self { cap, nested: false }
    }

    fn element() -> Self {
        Self {
            cap: 0,
            nested: true,
        }
    }
}

impl<'de> DeserializeSeed<'de> for ShallowSeed {
    type Value = Shallow;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Shallow, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ShallowSeed {
    type Value = Shallow;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Shallow, E> {
        Ok(Shallow::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Shallow, E> {
        Ok(Shallow::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Shallow, E> {
        Ok(match u64::try_from(v) {
            Ok(u) => Shallow::UInt(u),
            Err(_) => Shallow::NegInt(v),
        })
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Shallow, E> {
        Ok(Shallow::UInt(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Shallow, E> {
        Ok(Shallow::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Shallow, E> {
        Ok(Shallow::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Shallow, E> {
        Ok(Shallow::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shallow, A::Error> {
        if self.nested {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(Shallow::Other);
        }
        let mut items = Vec::new();
        let mut len: u64 = 0;
        loop {
            let more = if items.len() < self.cap {
                match seq.next_element_seed(ShallowSeed::element())? {
                    Some(item) => {
                        items.push(item);
                        true
                    }
                    None => false,
                }
            } else {
                seq.next_element::<IgnoredAny>()?.is_some()
            };
            if !more {
                break;
            }
            len = len.saturating_add(1);
        }
        Ok(Shallow::Seq { items, len })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shallow, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Shallow::Other)
    }
}
