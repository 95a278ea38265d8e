//! The one screen of `larch status`: a table per kind.

use std::fmt::Write as _;

use super::lines::{ExportLine, Overview, RestoreLine, SourceLine, SourceSetLine, WarningLine};

/// Columns padded to their widest cell.
pub(super) fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<String>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(&mut out, header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(&mut out, r);
    }
    out
}

pub(super) fn or_dash<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".into(), |v| v.to_string())
}

/// The one screen.
pub fn render(o: &Overview) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "ARCHIVE EXPORTS");
    out.push_str(&exports_table(&o.exports));
    let _ = writeln!(out, "\nARCHIVE SOURCES");
    out.push_str(&sources_table(&o.sources));
    let _ = writeln!(out, "\nARCHIVE RESTORES");
    out.push_str(&restores_table(&o.restores));
    let _ = writeln!(out, "\nARCHIVE SOURCE SETS");
    out.push_str(&source_sets_table(&o.source_sets));
    let _ = writeln!(out, "\nRECENT WARNINGS");
    out.push_str(&warnings_table(&o.warnings));
    if !o.notes.is_empty() {
        let _ = writeln!(out, "\nNOTES");
        for n in &o.notes {
            let _ = writeln!(out, "{n}");
        }
    }
    out
}

fn exports_table(exports: &[ExportLine]) -> String {
    table(
        &[
            "NAMESPACE",
            "NAME",
            "MODE",
            "READY",
            "LAST EXPORT",
            "RUN",
            "POSITION",
            "EPOCH",
            "ROWS",
            "PROGRESS",
            "SCHEDULE",
            "NEXT RUN",
        ],
        exports
            .iter()
            .map(|e| {
                vec![
                    e.namespace.clone(),
                    e.name.clone(),
                    e.mode.clone(),
                    ready_text(&e.ready, &e.reason),
                    or_dash(&e.last_export),
                    or_dash(&e.run),
                    or_dash(&e.position),
                    or_dash(&e.epoch),
                    or_dash(&e.rows),
                    or_dash(&e.progress),
                    or_dash(&e.schedule),
                    or_dash(&e.next_run),
                ]
            })
            .collect(),
    )
}

fn sources_table(sources: &[SourceLine]) -> String {
    table(
        &[
            "NAMESPACE",
            "NAME",
            "READY",
            "ENGINES",
            "CAUGHT UP",
            "LAG",
            "POSITION",
            "HEAD",
            "HEAD WRITTEN",
            "PROGRESS",
            "REBASELINES",
            "ROWS",
        ],
        sources
            .iter()
            .map(|s| {
                vec![
                    s.namespace.clone(),
                    s.name.clone(),
                    ready_text(&s.ready, &s.reason),
                    format!(
                        "{}/{}",
                        s.engines_ready.unwrap_or(0),
                        or_dash(&s.engines.or(Some(1)))
                    ),
                    or_dash(&s.caught_up),
                    or_dash(&s.lag),
                    or_dash(&s.position),
                    or_dash(&s.head),
                    or_dash(&s.head_time),
                    or_dash(&s.progress),
                    or_dash(&s.rebaselines),
                    or_dash(&s.rows),
                ]
            })
            .collect(),
    )
}

fn restores_table(restores: &[RestoreLine]) -> String {
    table(
        &[
            "NAMESPACE",
            "NAME",
            "READY",
            "RUN",
            "ROWS",
            "TABLES",
            "POSITION",
            "AT",
            "COMPLETED",
            "WAITING FOR DATABASE",
        ],
        restores
            .iter()
            .map(|r| {
                vec![
                    r.namespace.clone(),
                    r.name.clone(),
                    ready_text(&r.ready, &r.reason),
                    or_dash(&r.run),
                    or_dash(&r.rows),
                    if r.tables.is_empty() {
                        "-".into()
                    } else {
                        r.tables.join(",")
                    },
                    or_dash(&r.position),
                    or_dash(&r.at),
                    or_dash(&r.completed),
                    or_dash(&r.database_wait),
                ]
            })
            .collect(),
    )
}

fn source_sets_table(sets: &[SourceSetLine]) -> String {
    table(
        &["NAME", "READY", "NAMESPACES READY", "FAILING"],
        sets.iter()
            .map(|s| {
                vec![
                    s.name.clone(),
                    s.ready.clone(),
                    format!(
                        "{}/{}",
                        or_dash(&s.ready_namespaces),
                        or_dash(&s.desired_namespaces)
                    ),
                    if s.failing.is_empty() {
                        "-".into()
                    } else {
                        s.failing.join(", ")
                    },
                ]
            })
            .collect(),
    )
}

fn warnings_table(warnings: &[WarningLine]) -> String {
    table(
        &[
            "LAST SEEN",
            "NAMESPACE",
            "OBJECT",
            "REASON",
            "COUNT",
            "MESSAGE",
        ],
        warnings
            .iter()
            .map(|w| {
                vec![
                    or_dash(&w.last_seen),
                    w.namespace.clone(),
                    w.object.clone(),
                    w.reason.clone(),
                    w.count.to_string(),
                    w.message.chars().take(100).collect(),
                ]
            })
            .collect(),
    )
}

/// `True`, or the status with why it is not Ready.
fn ready_text(r: &str, why: &Option<String>) -> String {
    match why {
        Some(w) => format!("{r} ({w})"),
        None => r.to_string(),
    }
}
