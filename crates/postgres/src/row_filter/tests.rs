use super::*;

fn check(p: &str) -> Result<(), String> {
    check_row_filter(&"public.users".parse().unwrap(), p)
}

#[test]
fn predicates_on_the_row_pass() {
    for ok in [
        "id > 10",
        "a - b > 0",
        "users.id % 10 = 3 AND public.users.name IS NOT NULL",
        "name = 'it''s; fine -- not a comment /* nor this */'",
        r#""Weird )( name" = 'a)b'"#,
        "lower(email) LIKE '%@example.com' OR email ILIKE '%@EXAMPLE.org'",
        "created_at > CURRENT_TIMESTAMP - interval '90 days'",
        "created_at::date BETWEEN DATE '2024-01-01' AND '2024-12-31'",
        "extract(year FROM created_at) = 2024 AND date_trunc('month', created_at) IS NOT NULL",
        "status IN ('a', 'b') AND kind NOT IN (1, 2)",
        "CASE WHEN a > 1 THEN b ELSE c END = coalesce(d, nullif(e, 0), 3)",
        "CAST(x AS integer) > 0 AND y::numeric(10,2) < 3.5 AND greatest(a, b) > least(c, d)",
        "substring(name FROM 1 FOR 3) = 'abc' AND trim(both ' ' FROM name) <> ''",
        "flag IS TRUE AND a IS DISTINCT FROM b AND NOT (c = 1)",
        "name = E'\\\\'",
    ] {
        assert_eq!(check(ok), Ok(()), "{ok}");
    }
}

#[test]
fn anything_that_acts_or_reads_elsewhere_is_refused_by_name() {
    for (bad, why) in [
        (
            "pg_sleep(1e9) IS NULL",
            "function pg_sleep is not allowed in a row filter (allowed: abs, ",
        ),
        (
            "pg_drop_replication_slot('other_team') IS NULL",
            "function pg_drop_replication_slot is not allowed",
        ),
        (
            "pg_catalog.pg_terminate_backend(1)",
            "function pg_catalog.pg_terminate_backend is not allowed",
        ),
        ("pg_cancel_backend(1)", "function pg_cancel_backend"),
        ("set_config('a.b', 'c', false) = 'c'", "function set_config"),
        ("pg_notify('c', 'x') IS NULL", "function pg_notify"),
        ("pg_advisory_lock(1) IS NULL", "function pg_advisory_lock"),
        (
            "pg_logical_emit_message(true, 'x', 'y') IS NULL",
            "function pg_logical_emit_message",
        ),
        (
            "created_at > now() - interval '1 day'",
            "function now is not allowed",
        ),
        ("hashtext(email) > 0", "function hashtext"),
        ("public.lower(email) = 'a'", "function public.lower"),
        ("count(*) > 0", "function count"),
        (
            "id IN (SELECT user_id FROM orders)",
            "a subquery (SELECT …) is not allowed",
        ),
        ("EXISTS (SELECT 1 FROM pg_authid)", "a subquery"),
        ("id = $1", "a parameter ($n) is not allowed"),
        ("oid::regclass IS NULL", "a cast to regclass is not allowed"),
        ("'pg_sleep'::regproc IS NULL", "a cast to regproc"),
        (
            "other.id = 1",
            "column other.id is not allowed in a row filter (only columns of table public.users are)",
        ),
        ("x OPERATOR(public.=) 1", "a schema-qualified operator"),
        ("id = ANY(ARRAY[1])", "ANY/ALL is not allowed"),
        ("ROW(a, b) = ROW(1, 2)", "RowExpr is not allowed"),
        ("CURRENT_USER = 'postgres'", "a session value"),
        (
            "true; DROP TABLE users",
            "not valid SQL: syntax error at or near \";\"",
        ),
        (
            "true); DROP TABLE users; SELECT (1",
            "not several statements",
        ),
        ("true) LIMIT (1", "LIMIT is not allowed"),
        ("true) ORDER BY (1", "ORDER BY is not allowed"),
        (
            "true) UNION (SELECT 1 FROM pg_authid WHERE (true)",
            "UNION/INTERSECT/EXCEPT",
        ),
        ("true -- ) TO STDOUT", "comments"),
        ("true /* x */", "comments"),
        ("(true", "not valid SQL"),
        ("name = 'open", "not valid SQL"),
        ("  ", "empty"),
    ] {
        let e = check(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

/// Subqueries into public.orders (columns id, user_id, total kept; card masked) and
/// public.items (no rules).
fn with_subqueries(p: &str) -> Result<(), String> {
    let kept = ["id", "user_id", "total"].map(String::from).into();
    let masked = ["ssn"].map(String::from).into();
    let tables: SubqueryTables = [
        ("public.orders", ColumnSelection::Only(kept)),
        ("public.items", ColumnSelection::All),
        ("app.people", ColumnSelection::AllBut(masked)),
    ]
    .into_iter()
    .map(|(t, c)| (t.parse().unwrap(), c))
    .collect();
    check_row_filter_with(&"public.users".parse().unwrap(), p, Some(&tables))
}

#[test]
fn subqueries_into_exported_tables_pass_when_enabled() {
    for ok in [
        "EXISTS (SELECT 1 FROM public.orders o WHERE o.user_id = users.id AND o.total > 10)",
        "NOT EXISTS (SELECT 1 FROM public.orders WHERE orders.user_id = public.users.id)",
        "id IN (SELECT o.user_id FROM public.orders o) AND name IS NOT NULL",
        "id NOT IN (SELECT o.user_id FROM public.orders o WHERE o.id IN \
         (SELECT i.order_id FROM public.items i WHERE i.qty > 1))",
        "EXISTS (SELECT 1 FROM app.people p WHERE p.name = users.name)",
    ] {
        assert_eq!(with_subqueries(ok), Ok(()), "{ok}");
        assert!(
            check(ok).unwrap_err().contains("need `subqueries: true`"),
            "{ok}"
        );
    }
}

#[test]
fn subqueries_read_only_what_the_export_exports_unmasked() {
    for (bad, why) in [
        (
            "EXISTS (SELECT 1 FROM public.secrets s WHERE s.user_id = users.id)",
            "a subquery into public.secrets is not allowed in a row filter (subqueries read \
             only tables this export also exports: app.people, public.items, public.orders)",
        ),
        (
            "EXISTS (SELECT 1 FROM orders o WHERE o.user_id = users.id)",
            "a subquery names its table as schema.table",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o WHERE o.card LIKE '4%')",
            "column o.card is not allowed in a row filter (a subquery reads only columns that \
             this export exports unmasked, and public.orders masks card)",
        ),
        (
            "EXISTS (SELECT 1 FROM app.people p WHERE p.ssn = '1')",
            "app.people masks ssn",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o(a, b, c, card) WHERE o.card = '1')",
            "column aliases",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o WHERE user_id = 1)",
            "column user_id without its table inside a subquery",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o WHERE o IS NOT NULL)",
            "without its table inside a subquery",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o WHERE o.x.y.z = 1)",
            "column o.x.y.z is not allowed",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o JOIN public.items i ON true)",
            "a join or a function in a subquery's FROM",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o, public.items i)",
            "FROM in a subquery",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o LIMIT 1)",
            "LIMIT in a subquery",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o WHERE pg_sleep(1) IS NULL)",
            "function pg_sleep",
        ),
        (
            "id = ANY (SELECT o.user_id FROM public.orders o)",
            "this kind of subquery",
        ),
        (
            "(SELECT max(o.total) FROM public.orders o) > 1",
            "this kind of subquery",
        ),
        (
            "EXISTS (SELECT 1 FROM public.orders o WHERE EXISTS (SELECT 1 FROM public.items a \
             WHERE EXISTS (SELECT 1 FROM public.items b WHERE EXISTS \
             (SELECT 1 FROM public.items c))))",
            "nested deeper than 3",
        ),
    ] {
        let e = with_subqueries(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

/// Issue 35, finding 3: after `E'\''` the old scanner believed it was inside a string and
/// let a parenthesis, a comment and a LIMIT through.
#[test]
fn escape_strings_do_not_hide_what_follows() {
    for bad in [
        r"name = E'\'' ) LIMIT 1 --'",
        r"name <> E'\'' OR true) LIMIT (1",
        r"name = E'\'' OR pg_sleep(10) IS NULL OR name = ''",
    ] {
        let e = check(bad).unwrap_err();
        assert!(
            e.contains("LIMIT") || e.contains("comments") || e.contains("pg_sleep"),
            "{bad}: {e}"
        );
    }
}
