use super::*;

#[test]
fn a_checkpoint_is_trusted_only_with_the_table_it_was_written_with() {
    let t = TableId::new("public", "events");
    let now = "oid 16402 relfilenode 16402";
    let stored = |id: Option<&str>| Some(("0/200".to_string(), id.map(str::to_string)));
    assert_eq!(
        trusted_checkpoint(&t, stored(Some(now)), now),
        Resume::At("0/200".into())
    );
    let Resume::Baseline(why) =
        trusted_checkpoint(&t, stored(Some("oid 16390 relfilenode 16390")), now)
    else {
        panic!("a checkpoint of a dropped table was trusted");
    };
    assert!(why.contains("oid 16390") && why.contains(now), "{why}");
    assert!(matches!(
        trusted_checkpoint(&t, stored(None), now),
        Resume::Baseline(w) if w.contains("older larch")
    ));
    assert!(matches!(
        trusted_checkpoint(&t, None, now),
        Resume::Baseline(w) if w.contains("no checkpoint")
    ));
}

#[test]
fn types_map_back_to_sql() {
    assert_eq!(sql_type("int8"), "int8");
    assert_eq!(sql_type("_text"), "text[]");
    assert_eq!(sql_type(""), "jsonb");
    assert_eq!(sql_type("my_enum"), "text");
    assert_eq!(sql_type("timestamptz"), "timestamptz");
    let cols = vec![
        ColumnDefinition {
            name: "id".into(),
            type_name: "int8".into(),
            ordinal_position: 1,
            ..Default::default()
        },
        ColumnDefinition {
            name: "tags".into(),
            type_name: "_text".into(),
            nullable: true,
            ordinal_position: 2,
            ..Default::default()
        },
    ];
    assert_eq!(
        create_table_sql(&TableId::new("public", "e\"v"), &cols, &["id".into()]),
        r#"CREATE TABLE IF NOT EXISTS "public"."e""v" ("id" int8 NOT NULL, "tags" text[], PRIMARY KEY ("id"))"#
    );
}
