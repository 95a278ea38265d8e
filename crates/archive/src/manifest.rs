//! The per-table manifest (laredo spec §2.2) and object keys (§2.1).

use std::collections::BTreeMap;

use chrono::{DateTime, FixedOffset, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::ArchiveError;
use super::masking::{SubsetRecord, TransformRecord};
use super::model::ColumnDefinition;
use super::partitioning::PartitioningRecord;

pub const MANIFEST_VERSION: i64 = 1;
pub const MANIFEST_FILE: &str = "manifest.json";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArtifactKind {
    Snapshot,
    Diff,
}

/// Where one format of an artifact is stored. `sha256` is larch's additive integrity field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormatRef {
    #[serde(default)]
    pub uri: String,
    #[serde(default)]
    pub size_bytes: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub kind: ArtifactKind,
    #[serde(default)]
    pub epoch: i64,
    /// `None` for snapshots (serialised as `null`, always present).
    #[serde(default)]
    pub from_position: Option<String>,
    #[serde(default)]
    pub to_position: String,
    #[serde(with = "rfc3339")]
    pub created_at: DateTime<FixedOffset>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub row_count: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub change_count: i64,
    #[serde(default)]
    pub formats: BTreeMap<String, FormatRef>,
    /// larch's additive fields (laredo ignores them): a diff's commit times of the first and the
    /// last transaction it holds (from pgoutput's BEGIN), absent in archives laredo or an older
    /// larch wrote.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub first_commit_time: Option<DateTime<FixedOffset>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub last_commit_time: Option<DateTime<FixedOffset>>,
    /// larch's additive field: the time of the state a snapshot holds (a baseline: when its
    /// consistent point was taken; a compaction: the last commit time it folds in).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub snapshot_time: Option<DateTime<FixedOffset>>,
}

impl Artifact {
    /// The commit time of the state this artifact ends at: a snapshot's `snapshot_time`, a
    /// diff's `last_commit_time`.
    pub fn end_time(&self) -> Option<DateTime<FixedOffset>> {
        match self.kind {
            ArtifactKind::Snapshot => self.snapshot_time,
            ArtifactKind::Diff => self.last_commit_time,
        }
    }
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(default)]
    pub manifest_version: i64,
    #[serde(default)]
    pub table: String,
    #[serde(default)]
    pub epoch: i64,
    #[serde(with = "rfc3339", default = "zero_time")]
    pub updated_at: DateTime<FixedOffset>,
    #[serde(default)]
    pub head_position: String,
    /// laredo emits `null` for an empty list; both read as empty.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub artifacts: Vec<Artifact>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub columns: Vec<ColumnDefinition>,
    /// larch's additive field: the column transforms the current epoch's rows went through
    /// (masked exports); absent for a raw archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<TransformRecord>,
    /// larch's additive field: the subset of rows the current epoch holds (a one-shot export
    /// with `where:` or `sample:`); absent when it holds every row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<SubsetRecord>,
    /// larch's additive field: how the source table is partitioned (a restore that creates the
    /// table recreates its partitions); absent for a plain table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<PartitioningRecord>,
}

fn zero_time() -> DateTime<FixedOffset> {
    DateTime::<Utc>::MIN_UTC.fixed_offset()
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

mod rfc3339 {
    use super::*;

    pub fn serialize<S: Serializer>(t: &DateTime<FixedOffset>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_time(t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<FixedOffset>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map_err(|e| serde::de::Error::custom(format!("time {text:?}: {e}")))
    }
}

mod rfc3339_opt {
    use super::*;

    pub fn serialize<S: Serializer>(
        t: &Option<DateTime<FixedOffset>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&format_time(t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<DateTime<FixedOffset>>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) => DateTime::parse_from_rfc3339(&text)
                .map(Some)
                .map_err(|e| serde::de::Error::custom(format!("time {text:?}: {e}"))),
        }
    }
}

/// RFC 3339 with trailing fractional zeros removed, `Z` for UTC (Go's RFC3339Nano).
pub fn format_time(t: &DateTime<FixedOffset>) -> String {
    let s = t.to_rfc3339_opts(SecondsFormat::Nanos, true);
    // Trim trailing zeros of the fraction, and the dot if nothing remains.
    let (body, zone) = match s.rfind(['Z', '+', '-']) {
        Some(i) if i > 19 => s.split_at(i),
        _ => (s.as_str(), ""),
    };
    let body = if body.contains('.') {
        body.trim_end_matches('0').trim_end_matches('.')
    } else {
        body
    };
    format!("{body}{zone}")
}

pub fn now_utc() -> DateTime<FixedOffset> {
    Utc::now().fixed_offset()
}

impl Manifest {
    pub fn new(table: impl Into<String>) -> Manifest {
        Manifest {
            manifest_version: MANIFEST_VERSION,
            table: table.into(),
            epoch: 0,
            updated_at: now_utc(),
            head_position: String::new(),
            artifacts: Vec::new(),
            columns: Vec::new(),
            transform: None,
            subset: None,
            partitioning: None,
        }
    }

    /// Parses manifest bytes read from `key`, enforcing the version rule.
    pub fn from_slice(key: &str, bytes: &[u8]) -> Result<Manifest, ArchiveError> {
        // Check the version first so a newer manifest is refused even if its shape changed.
        #[derive(Deserialize)]
        struct VersionOnly {
            #[serde(default)]
            manifest_version: serde_json::Value,
        }
        let version: VersionOnly =
            serde_json::from_slice(bytes).map_err(|e| ArchiveError::Corrupt {
                key: key.to_string(),
                detail: format!("manifest is not valid JSON: {e}"),
            })?;
        if let Some(v) = version.manifest_version.as_i64() {
            if v > MANIFEST_VERSION {
                return Err(ArchiveError::UnsupportedManifestVersion {
                    key: key.to_string(),
                    version: v,
                });
            }
        } else if !version.manifest_version.is_null() {
            return Err(ArchiveError::Corrupt {
                key: key.to_string(),
                detail: format!(
                    "manifest_version must be an integer, found {}",
                    version.manifest_version
                ),
            });
        }
        serde_json::from_slice(bytes).map_err(|e| ArchiveError::Corrupt {
            key: key.to_string(),
            detail: format!("invalid manifest: {e}"),
        })
    }

    /// Pretty JSON with two-space indentation, like laredo's Writer.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("manifest serializes")
    }

    pub fn snapshots(&self) -> impl Iterator<Item = &Artifact> {
        self.artifacts
            .iter()
            .filter(|a| a.kind == ArtifactKind::Snapshot)
    }

    pub fn diffs(&self) -> impl Iterator<Item = &Artifact> {
        self.artifacts
            .iter()
            .filter(|a| a.kind == ArtifactKind::Diff)
    }
}

/// `P + "manifest.json"`.
pub fn manifest_key(key_prefix: &str) -> String {
    format!("{key_prefix}{MANIFEST_FILE}")
}

/// laredo's position sanitiser: empty → `0`; `/`, `:` and space → `_`.
pub fn sanitize_position(p: &str) -> String {
    if p.is_empty() {
        return "0".to_string();
    }
    p.replace(['/', ':', ' '], "_")
}

/// The object keys of an artifact, one per format larch knows (unknown format ids have none).
pub fn object_keys<'a>(
    key_prefix: &'a str,
    artifact: &'a Artifact,
) -> impl Iterator<Item = String> + 'a {
    artifact
        .formats
        .keys()
        .filter_map(|f| super::format::Format::parse(f).ok())
        .map(move |f| artifact_key(key_prefix, artifact, f.extension()))
}

/// Every object key `artifacts` reference.
pub fn referenced_keys(
    key_prefix: &str,
    artifacts: &[Artifact],
) -> std::collections::HashSet<String> {
    artifacts
        .iter()
        .flat_map(|a| object_keys(key_prefix, a))
        .collect()
}

/// The object key of one format of an artifact, derived exactly as laredo derives it (R1).
pub fn artifact_key(key_prefix: &str, artifact: &Artifact, extension: &str) -> String {
    match artifact.kind {
        ArtifactKind::Snapshot => format!(
            "{key_prefix}epoch={}/snapshot-{}{extension}",
            artifact.epoch,
            sanitize_position(&artifact.to_position)
        ),
        ArtifactKind::Diff => {
            let from = match &artifact.from_position {
                Some(f) => sanitize_position(f),
                None => "start".to_string(),
            };
            format!(
                "{key_prefix}epoch={}/diff-{from}-{}{extension}",
                artifact.epoch,
                sanitize_position(&artifact.to_position)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests' artifacts are all in epoch 2.
    fn art(kind: ArtifactKind, from: Option<&str>, to: &str) -> Artifact {
        crate::fixtures::art(kind, 2, from, to)
    }

    #[test]
    fn keys_match_laredo() {
        let s = art(ArtifactKind::Snapshot, None, "0/19F000");
        assert_eq!(
            artifact_key("public.events/", &s, ".jsonl"),
            "public.events/epoch=2/snapshot-0_19F000.jsonl"
        );
        let d = art(ArtifactKind::Diff, Some("0/19F000"), "0/1A2B3C");
        assert_eq!(
            artifact_key("public.events/", &d, ".pb"),
            "public.events/epoch=2/diff-0_19F000-0_1A2B3C.pb"
        );
        let d = art(ArtifactKind::Diff, Some(""), "a b:c");
        assert_eq!(artifact_key("", &d, ".jsonl"), "epoch=2/diff-0-a_b_c.jsonl");
    }

    #[test]
    fn times_render_like_go() {
        let t = DateTime::parse_from_rfc3339("2026-01-05T10:00:03.500Z").unwrap();
        assert_eq!(format_time(&t), "2026-01-05T10:00:03.5Z");
        let t = DateTime::parse_from_rfc3339("2026-01-05T10:00:03+02:00").unwrap();
        assert_eq!(format_time(&t), "2026-01-05T10:00:03+02:00");
    }

    #[test]
    fn manifest_accepts_laredo_shapes_and_refuses_newer_versions() {
        let m = Manifest::from_slice("m", br#"{"table":"t.t","artifacts":null}"#).unwrap();
        assert!(m.artifacts.is_empty());
        assert_eq!(m.manifest_version, 0);
        let e = Manifest::from_slice("m", br#"{"manifest_version":2}"#).unwrap_err();
        assert!(
            e.to_string().contains("unsupported manifest version"),
            "{e}"
        );
        let e = Manifest::from_slice("p/manifest.json", b"{not json").unwrap_err();
        assert!(e.to_string().contains("p/manifest.json"), "{e}");
    }

    #[test]
    fn snapshot_serialises_null_from_position() {
        let s = art(ArtifactKind::Snapshot, None, "0/1");
        let v: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert!(v.get("from_position").unwrap().is_null());
        assert!(v.get("row_count").is_none());
    }
}
