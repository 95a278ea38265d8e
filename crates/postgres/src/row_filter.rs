//! Row filters (`--where`, `transform.tables[*].where`) are parsed by PostgreSQL's own parser
//! (libpg_query, through the `pg_query` crate) and walked node by node: only what cannot act on
//! the server or read anything but the filtered row gets through. A filter comes from whoever
//! may write an export's spec (a tenant with `edit` in its namespace), and the COPY it goes
//! into runs on the production primary inside the exported snapshot; a scan of the text (what
//! larch did before) was bypassed by `E'\''` strings.
//!
//! What is allowed:
//! - references to the table's columns (`col`, `table.col`, `schema.table.col`);
//! - constants, `AND`/`OR`/`NOT`, comparison, arithmetic and `||` operators, the JSON
//!   accessors (`->`, `->>`, `#>`, `#>>`), `IS [NOT] NULL`,
//!   `IS [NOT] TRUE/FALSE/UNKNOWN`, `IS [NOT] DISTINCT FROM`, `[NOT] BETWEEN [SYMMETRIC]`,
//!   `[NOT] IN (list)`, `[NOT] LIKE`/`ILIKE`, `CASE`, `COALESCE`, `NULLIF`, `GREATEST`, `LEAST`;
//! - casts to built-in scalar types ([`ALLOWED_TYPES`]);
//! - calls of the immutable functions in [`ALLOWED_FUNCTIONS`] (no aggregates, windows,
//!   `VARIADIC` or named arguments);
//! - the time keywords `CURRENT_DATE`, `CURRENT_TIMESTAMP`, `LOCALTIMESTAMP`, `CURRENT_TIME`,
//!   `LOCALTIME` (the snapshot transaction's start: a moving window such as "the last 90 days"
//!   needs them; they act on nothing).
//!
//! - with subqueries enabled ([`SubqueryTables`]): `EXISTS (SELECT … FROM s.t [alias] WHERE …)`
//!   and `x [NOT] IN (SELECT … FROM s.t …)` into tables the same export also exports (read at
//!   the same snapshot), naming the table with its schema and every column with its table or
//!   alias, and only columns that table exports unmasked: a subquery reads nothing the archive
//!   does not already hold.
//!
//! Everything else is refused, naming the node: other subqueries, parameters, other functions
//! (`pg_sleep`, `pg_drop_replication_slot`, `set_config`, …), schema-qualified operators,
//! casts to other types (`regclass`, …), comments, and anything that is not part of the
//! predicate (a second statement, `LIMIT`, `ORDER BY`, `UNION`, …).
//!
//! The text checked is the text the COPY runs: `SELECT 1 FROM <table> WHERE (<filter>)` has the
//! same tokens around the filter as `COPY (SELECT <columns> FROM <table> WHERE (<filter>)) TO
//! STDOUT`, so a filter that closes the parenthesis itself shows up here as a clause other than
//! the `WHERE`. larch's sessions pin `standard_conforming_strings=on`
//! ([`crate::config::SESSION_OPTIONS`]), the parser's reading of backslashes in strings.

use std::collections::BTreeMap;

use larch_archive::model::{ColumnSelection, TableId};
use pg_query::NodeEnum;
use pg_query::protobuf::{self, AExprKind, Node, SetOperation, SqlValueFunctionOp, SubLinkType};

/// How deep subqueries may nest (`EXISTS (… IN (SELECT …))`).
const MAX_SUBQUERY_DEPTH: usize = 3;

/// The tables a row filter's subqueries may read, when subqueries are enabled: those the same
/// export exports, each with the columns it exports unmasked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubqueryTables {
    tables: BTreeMap<TableId, ColumnSelection>,
}

/// Each table subqueries may read, with the columns they may name.
impl FromIterator<(TableId, ColumnSelection)> for SubqueryTables {
    fn from_iter<I: IntoIterator<Item = (TableId, ColumnSelection)>>(tables: I) -> Self {
        SubqueryTables {
            tables: tables.into_iter().collect(),
        }
    }
}

impl SubqueryTables {
    fn names(&self) -> String {
        let names: Vec<String> = self.tables.keys().map(|t| t.to_string()).collect();
        names.join(", ")
    }
}

/// Functions a row filter may call: immutable, no side effects, no access to other rows or
/// tables. `extract`, `position`, `substring`, `trim` and `AT TIME ZONE` are SQL syntax the
/// parser turns into calls of `pg_catalog.extract`, `position`, `substring`, `btrim`/`ltrim`/
/// `rtrim` and `timezone`.
pub const ALLOWED_FUNCTIONS: &[&str] = &[
    "abs",
    "btrim",
    "ceil",
    "ceiling",
    "char_length",
    "character_length",
    "date_part",
    "date_trunc",
    "extract",
    "floor",
    "left",
    "length",
    "lower",
    "ltrim",
    "mod",
    "octet_length",
    "position",
    "replace",
    "right",
    "round",
    "rtrim",
    "sign",
    "starts_with",
    "strpos",
    "substr",
    "substring",
    "timezone",
    "trunc",
    "upper",
];

/// Types a row filter may cast to (the last part of the name, as the parser writes it:
/// `integer` is `int4`, `timestamp with time zone` is `timestamptz`): built-in scalar types
/// whose input functions read only their text.
pub const ALLOWED_TYPES: &[&str] = &[
    "bool",
    "bpchar",
    "bytea",
    "char",
    "date",
    "float4",
    "float8",
    "inet",
    "int2",
    "int4",
    "int8",
    "interval",
    "json",
    "jsonb",
    "numeric",
    "text",
    "time",
    "timestamp",
    "timestamptz",
    "timetz",
    "uuid",
    "varchar",
];

/// Operators (`a OP b`, `OP a`) a row filter may use; the JSON accessors read a key inside a
/// JSON column (a subset's virtual foreign key).
const ALLOWED_OPERATORS: &[&str] = &[
    "=", "<>", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "||", "~~", "!~~", "~~*", "!~~*",
    "->", "->>", "#>", "#>>",
];

/// Checks a row filter of `table`: `Ok` when it is one predicate made only of what the module
/// documentation lists; else why not, naming the node (`function pg_sleep is not allowed in a
/// row filter (allowed: …)`). Whether the columns exist and the types fit is the server's to
/// say (`EXPLAIN`, [`crate::snapshot::explain_row_filter`]).
pub fn check_row_filter(table: &TableId, predicate: &str) -> Result<(), String> {
    check_row_filter_with(table, predicate, None)
}

/// [`check_row_filter`], with subqueries into `subqueries`' tables allowed when it is given.
pub fn check_row_filter_with(
    table: &TableId,
    predicate: &str,
    subqueries: Option<&SubqueryTables>,
) -> Result<(), String> {
    if predicate.trim().is_empty() {
        return Err("the predicate is empty".into());
    }
    if predicate.contains('\0') {
        return Err("a NUL character is not allowed in a row filter".into());
    }
    // Comments are refused outright: a filter is one line of configuration, and a comment
    // could hide what follows from a reader of the spec.
    let tokens = pg_query::scan(predicate).map_err(|e| format!("not valid SQL: {}", reason(&e)))?;
    if tokens.tokens.iter().any(|t| {
        t.token == protobuf::Token::SqlComment as i32 || t.token == protobuf::Token::CComment as i32
    }) {
        return Err("comments (`--`, `/* */`) are not allowed in a row filter".into());
    }
    let sql = format!(
        "SELECT 1 FROM {} WHERE ({predicate})",
        crate::config::qualified(table)
    );
    let parsed = pg_query::parse(&sql, pg_query::ParserOptions::DEFAULT)
        .map_err(|e| format!("not valid SQL: {}", reason(&e)))?;
    let stmts = &parsed.protobuf.stmts;
    if stmts.len() != 1 {
        return Err("a row filter is one predicate, not several statements".into());
    }
    let Some(NodeEnum::SelectStmt(select)) = stmts[0].stmt.as_ref().and_then(|n| n.node.as_ref())
    else {
        return Err("a row filter is one predicate, not a statement".into());
    };
    if let Some(what) = extra_clause(select) {
        return Err(format!(
            "{what} is not allowed: a row filter is one predicate and cannot close the parenthesis it is put in"
        ));
    }
    let Some(filter) = select.where_clause.as_deref() else {
        return Err("the predicate is empty".into());
    };
    let outer = Frame {
        table: table.clone(),
        alias: None,
        columns: None,
    };
    Walker {
        frames: vec![outer],
        subqueries,
    }
    .node(filter)
}

/// The libpg_query error's message (it never holds more than the filter's own text).
fn reason(e: &pg_query::Error) -> String {
    match e {
        pg_query::Error::Parse(m) | pg_query::Error::Scan(m) => m.clone(),
        other => other.to_string(),
    }
}

/// A clause beside `SELECT <one item> FROM <one table> WHERE …`, if any. In the statement
/// larch builds, a filter that closed the parenthesis larch puts it in and went on (`true)
/// LIMIT 1 --`, `true) UNION (SELECT …`) adds one; a subquery may not have one either.
fn extra_clause(s: &protobuf::SelectStmt) -> Option<&'static str> {
    let extra = [
        (
            s.op != SetOperation::SetopNone as i32 || s.larg.is_some() || s.rarg.is_some(),
            "UNION/INTERSECT/EXCEPT",
        ),
        (!s.distinct_clause.is_empty(), "DISTINCT"),
        (s.into_clause.is_some(), "INTO"),
        (s.target_list.len() != 1, "a select list"),
        (s.from_clause.len() != 1, "FROM"),
        (!s.group_clause.is_empty(), "GROUP BY"),
        (s.having_clause.is_some(), "HAVING"),
        (!s.window_clause.is_empty(), "WINDOW"),
        (!s.values_lists.is_empty(), "VALUES"),
        (!s.sort_clause.is_empty(), "ORDER BY"),
        (s.limit_offset.is_some(), "OFFSET"),
        (s.limit_count.is_some(), "LIMIT"),
        (!s.locking_clause.is_empty(), "FOR UPDATE/SHARE"),
        (s.with_clause.is_some(), "WITH"),
    ];
    extra
        .iter()
        .find(|(present, _)| *present)
        .map(|(_, what)| *what)
}

/// A table whose columns the walked expression may name: the filtered table, then one per
/// enclosing subquery.
#[derive(Clone)]
struct Frame<'a> {
    table: TableId,
    alias: Option<String>,
    /// None: every column (the filtered table itself).
    columns: Option<&'a ColumnSelection>,
}

impl Frame<'_> {
    /// Whether `qualifier` (`t` of `t.col`) names this table: its alias if it has one (as in
    /// PostgreSQL, the alias hides the name), else its name.
    fn is_named(&self, qualifier: &str) -> bool {
        match &self.alias {
            Some(a) => a == qualifier,
            None => self.table.table == qualifier,
        }
    }
}

struct Walker<'a> {
    /// The filtered table first, the innermost subquery's table last.
    frames: Vec<Frame<'a>>,
    subqueries: Option<&'a SubqueryTables>,
}

fn not_allowed(what: impl std::fmt::Display) -> Result<(), String> {
    Err(format!("{what} is not allowed in a row filter"))
}

/// `{what} is not allowed in a row filter ({instead})`.
fn not_allowed_but(
    what: impl std::fmt::Display,
    instead: impl std::fmt::Display,
) -> Result<(), String> {
    Err(format!("{what} is not allowed in a row filter ({instead})"))
}

/// The names in a list of `String` nodes (function, operator, type and column names).
fn names(nodes: &[Node]) -> Option<Vec<&str>> {
    nodes
        .iter()
        .map(|n| match n.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        })
        .collect()
}

/// A node's kind as PostgreSQL names it (`RowExpr`, `SubLink`), for messages.
fn kind(node: &NodeEnum) -> String {
    let debug = format!("{node:?}");
    debug
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .next()
        .unwrap_or("this expression")
        .to_string()
}

impl<'a> Walker<'a> {
    fn all(&self, nodes: &[Node]) -> Result<(), String> {
        nodes.iter().try_for_each(|n| self.node(n))
    }

    fn opt(&self, node: Option<&Node>) -> Result<(), String> {
        node.map_or(Ok(()), |n| self.node(n))
    }

    fn node(&self, node: &Node) -> Result<(), String> {
        let Some(node) = node.node.as_ref() else {
            return Ok(());
        };
        match node {
            NodeEnum::AConst(_) => Ok(()),
            NodeEnum::ColumnRef(c) => self.column(c),
            NodeEnum::BoolExpr(b) => self.all(&b.args),
            NodeEnum::NullTest(t) => self.opt(t.arg.as_deref()),
            NodeEnum::BooleanTest(t) => self.opt(t.arg.as_deref()),
            NodeEnum::List(l) => self.all(&l.items),
            NodeEnum::AExpr(e) => self.operator(e),
            NodeEnum::TypeCast(c) => {
                self.cast(c.type_name.as_ref())?;
                self.opt(c.arg.as_deref())
            }
            NodeEnum::CaseExpr(c) => {
                self.opt(c.arg.as_deref())?;
                self.all(&c.args)?;
                self.opt(c.defresult.as_deref())
            }
            NodeEnum::CaseWhen(w) => {
                self.opt(w.expr.as_deref())?;
                self.opt(w.result.as_deref())
            }
            NodeEnum::CoalesceExpr(c) => self.all(&c.args),
            NodeEnum::MinMaxExpr(m) => self.all(&m.args),
            NodeEnum::FuncCall(f) => self.function(f),
            NodeEnum::SqlvalueFunction(f) => {
                use SqlValueFunctionOp as Op;
                let time = [
                    Op::SvfopCurrentDate,
                    Op::SvfopCurrentTime,
                    Op::SvfopCurrentTimeN,
                    Op::SvfopCurrentTimestamp,
                    Op::SvfopCurrentTimestampN,
                    Op::SvfopLocaltime,
                    Op::SvfopLocaltimeN,
                    Op::SvfopLocaltimestamp,
                    Op::SvfopLocaltimestampN,
                ];
                if time.iter().any(|op| *op as i32 == f.op) {
                    Ok(())
                } else {
                    not_allowed_but(
                        "a session value (CURRENT_USER, CURRENT_SCHEMA, …)",
                        "allowed: CURRENT_DATE, CURRENT_TIMESTAMP, LOCALTIMESTAMP, CURRENT_TIME, \
                         LOCALTIME",
                    )
                }
            }
            NodeEnum::SubLink(s) => self.subquery(s),
            NodeEnum::ParamRef(_) => not_allowed("a parameter ($n)"),
            NodeEnum::AStar(_) => not_allowed("`*`"),
            NodeEnum::NamedArgExpr(_) => not_allowed("a named argument (name => value)"),
            other => not_allowed(kind(other)),
        }
    }

    /// A column of the table: `col`, `table.col` or `schema.table.col`; inside a subquery,
    /// a column its table exports unmasked, named with its table or alias.
    fn column(&self, c: &protobuf::ColumnRef) -> Result<(), String> {
        let Some(parts) = names(&c.fields) else {
            return not_allowed("`*`");
        };
        if let [outer] = self.frames.as_slice() {
            let table = &outer.table;
            let ours = match parts.as_slice() {
                [_] => true,
                [t, _] => *t == table.table,
                [s, t, _] => *s == table.schema && *t == table.table,
                _ => false,
            };
            return if ours {
                Ok(())
            } else {
                not_allowed_but(
                    format!("column {}", parts.join(".")),
                    format!("only columns of table {table} are"),
                )
            };
        }
        let (frame, column) = match parts.as_slice() {
            [_] => {
                return not_allowed_but(
                    format!("column {} without its table inside a subquery", parts[0]),
                    "name it with its table or alias, e.g. o.user_id",
                );
            }
            [q, col] => (self.frames.iter().rev().find(|f| f.is_named(q)), *col),
            [s, t, col] => (
                self.frames
                    .iter()
                    .rev()
                    .find(|f| f.alias.is_none() && f.table.schema == *s && f.table.table == *t),
                *col,
            ),
            _ => (None, ""),
        };
        match frame {
            None => not_allowed_but(
                format!("column {}", parts.join(".")),
                "only columns of the filtered table and of its subqueries' tables are",
            ),
            Some(f) if f.columns.is_some_and(|c| !c.contains(column)) => not_allowed_but(
                format!("column {}", parts.join(".")),
                format!(
                    "a subquery reads only columns that this export exports unmasked, and {} masks {column}",
                    f.table
                ),
            ),
            Some(_) => Ok(()),
        }
    }

    /// `EXISTS (SELECT …)` or `x IN (SELECT …)` into one table this export also exports.
    fn subquery(&self, s: &protobuf::SubLink) -> Result<(), String> {
        let Some(tables) = self.subqueries else {
            return not_allowed_but(
                "a subquery (SELECT …)",
                "subqueries into tables the same export exports need `subqueries: true` in the \
                 transform rules, or --where-subqueries",
            );
        };
        if self.frames.len() > MAX_SUBQUERY_DEPTH {
            return not_allowed(format!(
                "a subquery nested deeper than {MAX_SUBQUERY_DEPTH}"
            ));
        }
        match SubLinkType::try_from(s.sub_link_type) {
            Ok(SubLinkType::ExistsSublink) => {}
            Ok(SubLinkType::AnySublink) if s.oper_name.is_empty() => {
                self.opt(s.testexpr.as_deref())?
            }
            _ => {
                return not_allowed_but(
                    "this kind of subquery",
                    "only EXISTS (SELECT …) and x IN (SELECT …) are",
                );
            }
        }
        let Some(NodeEnum::SelectStmt(select)) =
            s.subselect.as_deref().and_then(|n| n.node.as_ref())
        else {
            return not_allowed("a subquery that is not a SELECT");
        };
        if let Some(what) = extra_clause(select) {
            return not_allowed_but(
                format!("{what} in a subquery"),
                "a subquery is SELECT <one item> FROM <one table> WHERE …",
            );
        }
        let frame = self.subquery_table(select, tables)?;
        let mut frames = self.frames.clone();
        frames.push(frame);
        let inner = Walker {
            frames,
            subqueries: self.subqueries,
        };
        for target in &select.target_list {
            match target.node.as_ref() {
                Some(NodeEnum::ResTarget(t)) => inner.opt(t.val.as_deref())?,
                _ => return not_allowed("this select list in a subquery"),
            }
        }
        inner.opt(select.where_clause.as_deref())
    }

    /// The one table a subquery reads: schema-qualified, exported by the same export, no
    /// column aliases (they would rename a masked column past the check).
    fn subquery_table(
        &self,
        select: &protobuf::SelectStmt,
        tables: &'a SubqueryTables,
    ) -> Result<Frame<'a>, String> {
        let Some(NodeEnum::RangeVar(r)) = select.from_clause[0].node.as_ref() else {
            return Err(
                "a join or a function in a subquery's FROM is not allowed in a row filter (one table only)"
                    .into(),
            );
        };
        if r.schemaname.is_empty() || !r.catalogname.is_empty() {
            return Err(format!(
                "table {} is not allowed in a row filter (a subquery names its table as schema.table, e.g. public.orders)",
                r.relname
            ));
        }
        let id = TableId::new(&r.schemaname, &r.relname);
        let Some(columns) = tables.tables.get(&id) else {
            return Err(format!(
                "a subquery into {id} is not allowed in a row filter (subqueries read only tables this export also exports: {})",
                tables.names()
            ));
        };
        if r.alias.as_ref().is_some_and(|a| !a.colnames.is_empty()) {
            return Err(
                "column aliases in a subquery's FROM are not allowed in a row filter".into(),
            );
        }
        Ok(Frame {
            table: id,
            alias: r.alias.as_ref().map(|a| a.aliasname.clone()),
            columns: Some(columns),
        })
    }

    fn operator(&self, e: &protobuf::AExpr) -> Result<(), String> {
        use AExprKind as K;
        let name = names(&e.name).unwrap_or_default();
        let kind = K::try_from(e.kind).unwrap_or(K::Undefined);
        match kind {
            K::AexprOp => match name.as_slice() {
                [op] if ALLOWED_OPERATORS.contains(op) => {}
                [op] => {
                    return not_allowed_but(
                        format!("operator {op}"),
                        format!(
                            "allowed: {} AND OR NOT, IS [NOT] NULL, BETWEEN, IN (list), LIKE, ILIKE",
                            ALLOWED_OPERATORS.join(" ")
                        ),
                    );
                }
                _ => {
                    return not_allowed(format!(
                        "operator OPERATOR({}) (a schema-qualified operator)",
                        name.join(".")
                    ));
                }
            },
            K::AexprDistinct
            | K::AexprNotDistinct
            | K::AexprNullif
            | K::AexprIn
            | K::AexprLike
            | K::AexprIlike
            | K::AexprBetween
            | K::AexprNotBetween
            | K::AexprBetweenSym
            | K::AexprNotBetweenSym => {
                if name.len() != 1 {
                    return not_allowed("a schema-qualified operator");
                }
            }
            K::AexprOpAny | K::AexprOpAll => return not_allowed("ANY/ALL"),
            K::AexprSimilar => return not_allowed("SIMILAR TO"),
            K::Undefined => return not_allowed("this operator"),
        }
        self.opt(e.lexpr.as_deref())?;
        self.opt(e.rexpr.as_deref())
    }

    fn cast(&self, t: Option<&protobuf::TypeName>) -> Result<(), String> {
        let Some(t) = t else {
            return not_allowed("a cast without a type");
        };
        let parts = names(&t.names).unwrap_or_default();
        let allowed = match parts.as_slice() {
            [name] | ["pg_catalog", name] => ALLOWED_TYPES.contains(name),
            _ => false,
        };
        if !allowed || t.setof || t.pct_type {
            return not_allowed_but(
                format!("a cast to {}", parts.join(".")),
                format!("allowed: {}", ALLOWED_TYPES.join(", ")),
            );
        }
        self.all(&t.typmods)
    }

    fn function(&self, f: &protobuf::FuncCall) -> Result<(), String> {
        let parts = names(&f.funcname).unwrap_or_default();
        let name = match parts.as_slice() {
            [name] | ["pg_catalog", name] if ALLOWED_FUNCTIONS.contains(name) => *name,
            _ => {
                let hint = if parts.last() == Some(&"now") {
                    "; for the snapshot's time write CURRENT_TIMESTAMP"
                } else {
                    ""
                };
                return not_allowed_but(
                    format!("function {}", parts.join(".")),
                    format!("allowed: {}{hint}", ALLOWED_FUNCTIONS.join(", ")),
                );
            }
        };
        if f.agg_star
            || f.agg_distinct
            || f.func_variadic
            || f.agg_within_group
            || !f.agg_order.is_empty()
            || f.agg_filter.is_some()
            || f.over.is_some()
        {
            return not_allowed(format!(
                "{name}(…) with *, DISTINCT, VARIADIC, ORDER BY, FILTER, WITHIN GROUP or OVER"
            ));
        }
        self.all(&f.args)
    }
}

#[cfg(test)]
mod tests;
