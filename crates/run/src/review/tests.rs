use super::*;
use larch_archive::model::ColumnDefinition;

fn column(name: &str, type_name: &str, nullable: bool, max_length: i64) -> ColumnDefinition {
    ColumnDefinition {
        name: name.into(),
        type_name: type_name.into(),
        nullable,
        max_length,
        sql_type: type_name.into(),
        ..Default::default()
    }
}

#[test]
fn suggestions_fit_their_columns() {
    let t = TableId::new("public", "users");
    let rule = |c: &ColumnDefinition, key: bool| suggest_column(&t, c, key, None).map(|s| s.rule);
    assert_eq!(
        rule(&column("email", "text", false, 0), false),
        Some(ColumnRule::Hash)
    );
    assert_eq!(
        rule(&column("phone", "varchar", true, 40), false),
        Some(ColumnRule::Fake(FakeKind::Phone))
    );
    // Too short for a fake phone: NULL fits.
    assert_eq!(
        rule(&column("phone", "varchar", true, 10), false),
        Some(ColumnRule::Null)
    );
    // NOT NULL and too short: hash keeps the shape.
    assert_eq!(
        rule(&column("phone", "varchar", false, 10), false),
        Some(ColumnRule::Hash)
    );
    // A NOT NULL date: a constant.
    assert_eq!(
        rule(&column("date_of_birth", "date", false, 0), false),
        Some(ColumnRule::Redact("1970-01-01".into()))
    );
    assert_eq!(
        rule(&column("password", "text", true, 0), false),
        Some(ColumnRule::Null)
    );
    assert_eq!(
        rule(&column("email", "text", false, 0), true),
        Some(ColumnRule::Hash)
    );
    assert_eq!(
        rule(&column("last_ip", "inet", true, 0), false),
        Some(ColumnRule::Null)
    );
    assert_eq!(
        rule(&column("peer", "inet", true, 0), false),
        Some(ColumnRule::Null)
    );
    assert_eq!(
        rule(&column("email_verified", "bool", false, 0), false),
        None
    );
    // Values say it when the name does not.
    let mut e = detect::ValueEvidence::default();
    e.add("write to ann@example.org");
    let s = suggest_column(&t, &column("notes", "text", true, 0), false, Some(&e)).unwrap();
    assert_eq!(s.rule, ColumnRule::Null);
    assert_eq!(s.reason, "1 of 1 sampled values hold email addresses");
    // Not for a column whose type holds no text.
    assert!(suggest_column(&t, &column("n", "int8", true, 0), false, Some(&e)).is_none());
}

#[test]
fn unreviewed_columns_are_those_the_rules_do_not_name() {
    let rules = TransformRules::parse(
        "tables:\n  public.users:\n    columns: {id: hash, email: hash}\n",
        "test",
    )
    .unwrap();
    let t = TableId::new("public", "users");
    let cols = [
        column("id", "int8", false, 0),
        column("email", "text", false, 0),
        column("phone2", "text", true, 0),
        column("plan", "text", true, 0),
    ];
    let u = unreviewed(&rules, &t, &cols, &["id".into()]);
    let got: Vec<(&str, &str, &str)> = u
        .iter()
        .map(|c| (c.column.as_str(), c.applied.as_str(), c.suggestion.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("phone2", "null", "{fake: phone}"),
            ("plan", "null", "keep")
        ]
    );
    assert!(unreviewed(&rules, &TableId::new("public", "other"), &cols, &[]).is_empty());
}

#[test]
fn a_rendered_file_parses_as_the_rules_it_shows() {
    let existing = TransformRules::parse(
        "tables:\n  public.users:\n    undeclared: keep\n    where: \"id > 1\"\n    columns: {ssn: drop}\n  public.gone:\n    columns: {x: hash}\n",
        "rules.yaml",
    )
    .unwrap();
    let t = TableId::new("public", "users");
    let reviews = [suggest::TableReview {
        table: t.clone(),
        sampled_rows: 3,
        columns: vec![
            ("id".into(), suggest::Decision::Harmless),
            ("ssn".into(), suggest::Decision::Covered(ColumnRule::Drop)),
            (
                "e-mail".into(),
                suggest::Decision::Sensitive(Suggestion {
                    rule: ColumnRule::Redact("x".into()),
                    reason: "its name suggests email addresses".into(),
                }),
            ),
        ],
    }];
    let text = suggest::render(&reviews, Some((&existing, "rules.yaml")), 200, "0.1.0");
    let parsed = TransformRules::parse(&text, "output").unwrap_or_else(|e| panic!("{e}\n{text}"));
    let users = &parsed.tables["public.users"];
    assert_eq!(users.undeclared, ColumnRule::Keep);
    assert_eq!(users.row_filter.as_deref(), Some("id > 1"));
    assert_eq!(users.columns["id"], ColumnRule::Keep);
    assert_eq!(users.columns["ssn"], ColumnRule::Drop);
    assert_eq!(users.columns["e-mail"], ColumnRule::Redact("x".into()));
    assert_eq!(parsed.tables["public.gone"].columns["x"], ColumnRule::Hash);
    assert!(
        text.contains("# its name suggests email addresses"),
        "{text}"
    );
    assert!(text.contains("# from rules.yaml"), "{text}");
}
