//! Replication slots in an ArchiveExport's status: the WAL each writer's slot holds (from the
//! writers' `/status`, or from the slot monitor while suspended), the WAL held at suspension,
//! and Events for a slot at risk of invalidation or lost.

use kube::runtime::events::{Event, EventType};

use crate::crd::archive_export::{ArchiveExport, WriterStatus};
use crate::export::cleanup_job::{kept_slots, table_of_slot};
use crate::export::observe::{SlotReport, set_slot};
use larch_core::units::format_bytes;

/// Writers' status for this reconcile. Running: what the writers reported. Suspended: the last
/// report of each writer, with its slot's figures from the monitor and, from the first monitor
/// reading on, the WAL held at suspension.
pub fn merge_writers(
    export: &ArchiveExport,
    old: &[WriterStatus],
    reported: Vec<WriterStatus>,
    monitor: Option<SlotReport>,
    suspended: bool,
) -> Vec<WriterStatus> {
    if !suspended {
        return reported;
    }
    let mut out: Vec<WriterStatus> = old.to_vec();
    let Some(SlotReport { slots, observed_at }) = monitor else {
        return out;
    };
    for slot in slots {
        let Some(table) = table_of_slot(export, &slot.name) else {
            continue;
        };
        let w = match out.iter_mut().position(|w| w.table == table) {
            Some(i) => &mut out[i],
            None => {
                out.push(WriterStatus {
                    table: table.clone(),
                    ..Default::default()
                });
                out.last_mut().expect("pushed")
            }
        };
        set_slot(w, &slot);
        w.buffer_depth = None;
        w.slot_observed_at = observed_at.clone();
        if w.retained_wal_bytes_at_suspension.is_none() {
            w.retained_wal_bytes_at_suspension = w.retained_wal_bytes;
        }
    }
    out.sort_by(|a, b| a.table.cmp(&b.table));
    out.truncate(32);
    out
}

/// What a suspended export's Ready condition says about its kept slots.
pub fn suspended_slots(export: &ArchiveExport, writers: &[WriterStatus]) -> Vec<String> {
    kept_slots(export)
        .into_iter()
        .map(|(t, slot)| {
            let w = writers.iter().find(|w| w.table == t.qualified());
            let figure = |b: Option<i64>| b.map(|b| format_bytes(b.max(0) as u64));
            match w.map(|w| (figure(w.retained_wal_bytes_at_suspension), figure(w.retained_wal_bytes), w.wal_status.as_deref())) {
                Some((_, _, Some("missing"))) => format!("replication slot {slot} does not exist any more (resume takes a new baseline)"),
                Some((Some(at), Some(now), _)) => format!(
                    "replication slot {slot} is kept so resume continues; it held {at} of WAL at suspension and holds {now} now"
                ),
                _ => format!("replication slot {slot} is kept so resume continues (its WAL is not measured yet)"),
            }
        })
        .collect()
}

/// Events for slots that became at risk (`wal_status` unreserved) or were lost by a writer
/// since the previous status.
pub fn slot_events(old: &[WriterStatus], new: &[WriterStatus]) -> Vec<Event> {
    let mut out = vec![];
    for w in new {
        let before = old.iter().find(|o| o.table == w.table);
        let slot = w.slot.as_deref().unwrap_or("?");
        let losses = w.slot_losses.unwrap_or(0);
        let losses_before = before.and_then(|b| b.slot_losses).unwrap_or(0);
        // A restarted writer counts from zero: an increase, or a loss other than the one
        // already reported (its text carries the time), is news.
        let new_loss = w.last_slot_loss.is_some()
            && w.last_slot_loss != before.and_then(|b| b.last_slot_loss.clone());
        if losses > losses_before || new_loss {
            let why = w.last_slot_loss.clone().unwrap_or_default();
            let reason = if why.contains("invalidated") {
                "SlotInvalidated"
            } else {
                "SlotLost"
            };
            out.push(Event {
                type_: EventType::Warning,
                reason: reason.into(),
                note: Some(
                    format!(
                        "{}: {why}; the writer takes a new baseline (a new epoch) so no change in the gap is lost, and followers re-baseline",
                        w.table
                    )
                    .chars()
                    .take(1000)
                    .collect(),
                ),
                action: "Observe".into(),
                secondary: None,
            });
        }
        let at_risk = w.wal_status.as_deref() == Some("unreserved");
        let was_at_risk = before.and_then(|b| b.wal_status.as_deref()) == Some("unreserved");
        if at_risk && !was_at_risk {
            out.push(Event {
                type_: EventType::Warning,
                reason: "SlotAtRisk".into(),
                note: Some(format!(
                    "replication slot {slot} ({}) holds {} of WAL, more than max_slot_wal_keep_size allows: the next checkpoint invalidates it (wal_status unreserved)",
                    w.table,
                    format_bytes(w.retained_wal_bytes.unwrap_or(0).max(0) as u64)
                )),
                action: "Observe".into(),
                secondary: None,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::tests::export_fixture;
    use crate::export::observe::SlotJson;

    fn slot(name: &str, bytes: i64) -> SlotJson {
        SlotJson {
            name: name.into(),
            exists: true,
            wal_status: Some("reserved".into()),
            retained_wal_bytes: Some(bytes),
            lag_bytes: Some(bytes),
        }
    }

    #[test]
    fn suspended_status_keeps_the_last_report_and_the_wal_at_suspension() {
        let mut e = export_fixture("export-continuous-s3");
        e.spec.suspend = Some(true);
        let slot_name = crate::export::cleanup_job::kept_slots(&e)[0].1.clone();
        let last = vec![WriterStatus {
            table: "public.events".into(),
            epoch: Some(3),
            head_position: Some("0/10".into()),
            buffer_depth: Some(4),
            slot: Some(slot_name.clone()),
            retained_wal_bytes: Some(100),
            ..Default::default()
        }];
        let m = Some(SlotReport {
            slots: vec![slot(&slot_name, 4096)],
            observed_at: Some("t1".into()),
        });
        let w = merge_writers(&e, &last, vec![], m, true);
        assert_eq!(
            (w[0].epoch, w[0].head_position.as_deref()),
            (Some(3), Some("0/10"))
        );
        assert_eq!(w[0].retained_wal_bytes, Some(4096));
        assert_eq!(w[0].retained_wal_bytes_at_suspension, Some(4096));
        assert_eq!(w[0].buffer_depth, None);
        // Later readings grow; the figure at suspension stays.
        let m = Some(SlotReport {
            slots: vec![slot(&slot_name, 1 << 20)],
            observed_at: Some("t2".into()),
        });
        let w = merge_writers(&e, &w, vec![], m, true);
        assert_eq!(
            (
                w[0].retained_wal_bytes,
                w[0].retained_wal_bytes_at_suspension
            ),
            (Some(1 << 20), Some(4096))
        );
        let msg = suspended_slots(&e, &w).join("; ");
        assert!(
            msg.contains(&format!("replication slot {slot_name} is kept"))
                && msg.contains("4.0 KiB of WAL at suspension")
                && msg.contains("1.0 MiB now"),
            "{msg}"
        );
        // Running again: the writers' own reports, nothing from the suspension.
        let reported = vec![WriterStatus {
            table: "public.events".into(),
            ..Default::default()
        }];
        let w = merge_writers(&e, &w, reported.clone(), None, false);
        assert_eq!(w, reported);
    }

    #[test]
    fn lost_and_at_risk_slots_make_events_once() {
        let before = vec![WriterStatus {
            table: "public.events".into(),
            slot: Some("s".into()),
            slot_losses: Some(0),
            wal_status: Some("extended".into()),
            ..Default::default()
        }];
        let mut after = before.clone();
        after[0].slot_losses = Some(1);
        after[0].last_slot_loss =
            Some("replication slot s was invalidated (wal_status = lost, WAL removed)".into());
        after[0].wal_status = Some("unreserved".into());
        let events = slot_events(&before, &after);
        let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons, ["SlotInvalidated", "SlotAtRisk"]);
        assert!(slot_events(&after, &after).is_empty(), "no repeat");
        // A restarted writer that finds its slot lost again counts from one.
        let mut restarted = after.clone();
        restarted[0].last_slot_loss = Some("replication slot s was invalidated (at t2)".into());
        let reasons: Vec<String> = slot_events(&after, &restarted)
            .into_iter()
            .map(|e| e.reason)
            .collect();
        assert_eq!(reasons, ["SlotInvalidated"]);
    }
}
