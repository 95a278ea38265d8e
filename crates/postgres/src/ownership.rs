//! Who owns a replication slot and a publication on the source database, as larch records it.
//!
//! A publication larch creates carries the comment
//! `larch: created for replication slot <slot> by <owner>`, written with `CREATE PUBLICATION`
//! before the slot exists. The owner is who the export runs for: the operator passes
//! `archiveexport/<namespace>/<name>`, `larch export` defaults to `cli` (`--owner`). That one
//! record covers both objects: the slot is owned through the publication that names it.
//! larch drops a slot or a publication only when the record names that slot and the same
//! owner; anything else is refused, naming the object and its recorded owner.
//!
//! Older larch versions wrote the comment without ` by <owner>`: such a record is *legacy*, it
//! says larch made the objects but not for whom, and is never enough for a drop unless the
//! caller adopts it explicitly (`larch export cleanup --adopt-legacy`).

use anyhow::Context;
use tokio_postgres::Client;

use super::config::{PostgresConfig, literal};

/// How a publication's comment starts when larch created it.
pub const OWNER_COMMENT_PREFIX: &str = "larch: created for replication slot ";
const OWNER_SEPARATOR: &str = " by ";
/// The owner `larch export` records when none is given.
pub const DEFAULT_OWNER: &str = "cli";

/// Refuses an owner that could not be recorded and read back: 1 to 256 bytes of printable
/// text (`archiveexport/<namespace>/<name>`); the same rule for `--owner` and a request's
/// `owner`.
pub fn check_owner(owner: &str) -> Result<(), String> {
    if owner.is_empty() || owner.len() > 256 || owner.chars().any(char::is_control) {
        return Err(
            "an owner is 1 to 256 bytes of printable text (e.g. archiveexport/<namespace>/<name>)"
                .into(),
        );
    }
    Ok(())
}

/// The comment that records a publication (and the slot it names) as `owner`'s.
pub fn owner_comment(slot: &str, owner: &str) -> String {
    format!("{OWNER_COMMENT_PREFIX}{slot}{OWNER_SEPARATOR}{owner}")
}

/// What a publication's larch comment says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRecord {
    pub slot: String,
    /// `None`: a legacy record (an older larch, no owner).
    pub owner: Option<String>,
}

impl OwnerRecord {
    /// `None` when the comment is not larch's. A slot name has no spaces (PostgreSQL allows
    /// `[a-z0-9_]` only), so the first ` by ` ends it.
    pub fn parse(comment: &str) -> Option<OwnerRecord> {
        let rest = comment.strip_prefix(OWNER_COMMENT_PREFIX)?;
        Some(match rest.split_once(OWNER_SEPARATOR) {
            Some((slot, owner)) => OwnerRecord {
                slot: slot.to_string(),
                owner: Some(owner.to_string()),
            },
            None => OwnerRecord {
                slot: rest.to_string(),
                owner: None,
            },
        })
    }
}

/// A publication and its larch record (`None`: no larch comment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicationRecord {
    pub name: String,
    pub record: Option<OwnerRecord>,
}

/// The publication, `None` when it does not exist.
pub async fn publication(client: &Client, name: &str) -> anyhow::Result<Option<PublicationRecord>> {
    let row = client
        .query_opt(
            "SELECT obj_description(p.oid, 'pg_publication') FROM pg_publication p WHERE p.pubname = $1",
            &[&name],
        )
        .await
        .with_context(|| format!("looking up publication {name}"))?;
    Ok(row.map(|r| {
        let comment: Option<String> = r.get(0);
        PublicationRecord {
            name: name.to_string(),
            record: comment.as_deref().and_then(OwnerRecord::parse),
        }
    }))
}

/// Whether the caller may drop `slot` and the publication `publication` (`None`: absent).
/// `Err` says why not, naming the object and its recorded owner.
pub fn check(
    publication: Option<&PublicationRecord>,
    publication_name: &str,
    slot: &str,
    owner: &str,
    adopt_legacy: bool,
) -> Result<(), String> {
    let Some(p) = publication else {
        return Err(format!(
            "no larch owner record: publication {publication_name}, where larch records who owns \
             replication slot {slot}, does not exist"
        ));
    };
    let Some(r) = &p.record else {
        return Err(format!(
            "no larch owner record: publication {publication_name} has no larch comment (larch did \
             not create it)"
        ));
    };
    if r.slot != slot {
        return Err(format!(
            "publication {publication_name} is recorded for replication slot {} (owner {}), not {slot}",
            r.slot,
            r.owner.as_deref().unwrap_or("not recorded")
        ));
    }
    match r.owner.as_deref() {
        Some(o) if o == owner => Ok(()),
        Some(o) => Err(format!(
            "publication {publication_name} and replication slot {slot} are recorded as owned by \
             {o}, not {owner}"
        )),
        None if adopt_legacy => Ok(()),
        None => Err(format!(
            "no larch owner record: publication {publication_name} was created for replication \
             slot {slot} by a larch version that did not record an owner; if they are this \
             export's, adopt them (larch export cleanup --adopt-legacy, or the ArchiveExport \
             annotation larch.dev/adopt-legacy-slot: \"true\")"
        )),
    }
}

/// Fails unless the existing slot `config.slot_name` is recorded as `config.owner`'s: a new
/// baseline replaces only its own slot.
pub async fn check_replaceable(client: &Client, config: &PostgresConfig) -> anyhow::Result<()> {
    let (slot, name) = (&config.slot_name, &config.publication_name);
    let record = publication(client, name).await?;
    check(record.as_ref(), name, slot, &config.owner, false).map_err(|why| {
        anyhow::anyhow!(
            "replication slot {slot} already exists and larch will not drop it for a new \
             baseline: {why}; choose another slot name, or drop it yourself if it is unused: \
             SELECT pg_drop_replication_slot({})",
            literal(slot)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(comment: Option<&str>) -> PublicationRecord {
        PublicationRecord {
            name: "p".into(),
            record: comment.and_then(OwnerRecord::parse),
        }
    }

    #[test]
    fn the_record_names_the_slot_and_the_owner_and_parses_back() {
        let c = owner_comment("larch_data_users", "archiveexport/team-a/users");
        assert_eq!(
            c,
            "larch: created for replication slot larch_data_users by archiveexport/team-a/users"
        );
        assert_eq!(
            OwnerRecord::parse(&c),
            Some(OwnerRecord {
                slot: "larch_data_users".into(),
                owner: Some("archiveexport/team-a/users".into())
            })
        );
        assert_eq!(
            OwnerRecord::parse("larch: created for replication slot old_slot"),
            Some(OwnerRecord {
                slot: "old_slot".into(),
                owner: None
            })
        );
        assert_eq!(OwnerRecord::parse("made by hand"), None);
    }

    #[test]
    fn only_the_recorded_owner_of_that_slot_may_drop() {
        let ours = rec(Some(&owner_comment("s", "archiveexport/a/x")));
        assert_eq!(
            check(Some(&ours), "p", "s", "archiveexport/a/x", false),
            Ok(())
        );
        let err = check(Some(&ours), "p", "s", "archiveexport/b/x", false).unwrap_err();
        assert!(
            err.contains("owned by archiveexport/a/x, not archiveexport/b/x"),
            "{err}"
        );
        let err = check(Some(&ours), "p", "other", "archiveexport/a/x", false).unwrap_err();
        assert!(err.contains("recorded for replication slot s"), "{err}");
        let err = check(None, "p", "s", "cli", false).unwrap_err();
        assert!(err.starts_with("no larch owner record"), "{err}");
        let err = check(Some(&rec(Some("hand-made"))), "p", "s", "cli", true).unwrap_err();
        assert!(err.starts_with("no larch owner record"), "{err}");
        let legacy = rec(Some("larch: created for replication slot s"));
        let err = check(Some(&legacy), "p", "s", "cli", false).unwrap_err();
        assert!(err.contains("--adopt-legacy"), "{err}");
        assert_eq!(check(Some(&legacy), "p", "s", "cli", true), Ok(()));
        // Adoption is for a legacy record of this very slot only.
        assert!(check(Some(&legacy), "p", "t", "cli", true).is_err());
    }
}
