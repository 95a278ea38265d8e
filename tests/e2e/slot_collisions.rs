//! Issue 35, finding 4, on the control plane: exports whose namespace and name read alike
//! (`team-a`/`b-users`, `team-a-b`/`users`: both `larch_team_a_b_users` before names were
//! hashed) hold distinct slots and publications, and one's `deletionPolicy: Delete` cleanup
//! drops only its own.

use serde_json::Value;

use super::helpers::{
    archive_row_count, export_manifest, publication_count, slot_count, writer_pods,
};
use super::support::{Env, condition_is, env_with_operator, serial};

const TABLE: &str = "collided";
/// (namespace, name, bucket) of the two exports.
const EXPORTS: [(&str, &str, &str); 2] = [
    ("team-a", "b-users", "collide-a"),
    ("team-a-b", "users", "collide-b"),
];

/// A Continuous export of `public.collided` with `deletionPolicy: Delete`, diffs every second.
fn apply_export(e: &Env, ns: &str, name: &str, bucket: &str) {
    e.namespace(ns, &[]);
    e.bucket(bucket);
    let table_line = format!("    table: {{schema: public, name: {TABLE}}}\n");
    let mut m = export_manifest(e, ns, name, TABLE, "Continuous", bucket).replace(
        &table_line,
        &format!("{table_line}    deletionPolicy: Delete\n"),
    );
    assert!(m.contains("deletionPolicy: Delete"), "{m}");
    m.push_str("  continuous: {diffInterval: 1s}\n");
    e.apply(&m);
}

/// The slot the export's writer reports in its status, once it holds one.
fn reported_slot(e: &Env, ns: &str, name: &str) -> String {
    e.wait_for(ns, "the writer's slot in status", 300, || {
        let o = e.get(&["archiveexport", name, "-n", ns])?;
        let slot = o["status"]["writers"][0]["slot"].as_str()?;
        condition_is(&o, "Ready", "True").then(|| slot.to_string())
    })
}

/// The owner recorded with publication `name`.
fn publication_owner(e: &Env, name: &str) -> String {
    e.sql(&format!(
        "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = '{name}'"
    ))
}

/// Scenario 36: two Continuous ArchiveExports of one table whose namespace/name read alike
/// (`team-a`/`b-users`, `team-a-b`/`users`) hold two distinct slots and publications, each
/// recorded for its own export; deleting one (`deletionPolicy: Delete`) drops its slot and
/// publication only, and the other keeps streaming changes into its archive.
#[test]
fn s36_look_alike_exports_hold_distinct_slots_and_a_delete_drops_only_its_own() {
    let _g = serial();
    let e = env_with_operator();
    e.sql(&format!(
        "DROP TABLE IF EXISTS public.{TABLE}; \
         CREATE TABLE public.{TABLE} AS SELECT * FROM public.events WHERE id <= 150; \
         ALTER TABLE public.{TABLE} ADD PRIMARY KEY (id)"
    ));
    for (ns, name, bucket) in EXPORTS {
        apply_export(e, ns, name, bucket);
    }
    let [(ns_a, name_a, _), (ns_b, name_b, bucket_b)] = EXPORTS;
    let slot_a = reported_slot(e, ns_a, name_a);
    let slot_b = reported_slot(e, ns_b, name_b);
    assert_ne!(slot_a, slot_b, "look-alike exports share a slot");
    // On the database: both slots and both publications (named as the slots), nothing else
    // under the readable name they share, each publication recorded for its own export.
    for slot in [&slot_a, &slot_b] {
        assert_eq!((slot_count(e, slot), publication_count(e, slot)), (1, 1));
    }
    let alike: i64 = e
        .sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'larch\\_team\\_a\\_b\\_users\\_%'")
        .parse()
        .unwrap();
    assert_eq!(alike, 2, "{slot_a} and {slot_b}");
    for (slot, ns, name) in [(&slot_a, ns_a, name_a), (&slot_b, ns_b, name_b)] {
        let owner = publication_owner(e, slot);
        assert!(
            owner.ends_with(&format!("by archiveexport/{ns}/{name}")),
            "{slot}: {owner}"
        );
    }

    // Delete team-a/b-users: its cleanup drops its slot and publication, not the other's.
    e.kubectl(&[
        "delete",
        "archiveexport",
        name_a,
        "-n",
        ns_a,
        "--wait=false",
    ]);
    e.wait_for(ns_a, "its slot and publication dropped", 120, || {
        (slot_count(e, &slot_a) == 0 && publication_count(e, &slot_a) == 0).then_some(())
    });
    e.wait_for(ns_a, "the ArchiveExport gone", 120, || {
        e.get(&["archiveexport", name_a, "-n", ns_a])
            .is_none()
            .then_some(())
    });
    assert_eq!(
        (slot_count(e, &slot_b), publication_count(e, &slot_b)),
        (1, 1),
        "the other export's slot and publication survive the cleanup"
    );
    assert!(
        publication_owner(e, &slot_b).ends_with(&format!("by archiveexport/{ns_b}/{name_b}")),
        "the other export's publication keeps its record"
    );

    // The survivor still streams: changes made after the delete reach its archive.
    e.sql(&format!(
        "INSERT INTO public.{TABLE} SELECT id + 100000, tenant, kind, amount, payload, \
           created_at, tags, flag, ref, blob FROM public.events WHERE id <= 40; \
         DELETE FROM public.{TABLE} WHERE id <= 10"
    ));
    let rows: i64 = e
        .sql(&format!("SELECT count(*) FROM public.{TABLE}"))
        .parse()
        .unwrap();
    let prefix = format!("public.{TABLE}/");
    e.wait_for(ns_b, "the changes in the survivor's archive", 180, || {
        (archive_row_count(e, bucket_b, &prefix) == rows).then_some(())
    });
    let o: Value = e.get(&["archiveexport", name_b, "-n", ns_b]).unwrap();
    assert!(condition_is(&o, "Ready", "True"), "{}", o["status"]);
    assert_eq!(writer_pods(e, ns_b, name_b).len(), 1);
    assert_eq!(slot_count(e, &slot_b), 1);

    // Leave nothing holding WAL for the scenarios after this one.
    e.kubectl(&[
        "delete",
        "archiveexport",
        name_b,
        "-n",
        ns_b,
        "--wait=false",
    ]);
    e.wait_for(
        ns_b,
        "the survivor's slot dropped on its delete",
        120,
        || (slot_count(e, &slot_b) == 0 && publication_count(e, &slot_b) == 0).then_some(()),
    );
}
