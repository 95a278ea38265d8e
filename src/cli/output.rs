//! `-o/--output`: how every command that prints a result prints it (docs/cli.md, "Output").
//! `table` is the form for people, where a command has one (its default); `json` and `yaml`
//! carry the same document for scripts. `--json` is the older spelling of `-o json`, kept
//! hidden so that scripts written for it keep working.

use clap::{Args, ValueEnum};
use serde::Serialize;

/// The formats of a command with a form for people.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// For people: aligned text.
    Table,
    /// One JSON document (pretty-printed).
    Json,
    /// The same document as YAML.
    Yaml,
}

/// The formats of a command whose result is a document only (a summary or a report).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocumentOutput {
    Json,
    Yaml,
}

/// `-o table|json|yaml` (default table), and the deprecated `--json`.
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Output format: `table` (for people), `json` or `yaml` (for scripts).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Deprecated spelling of `-o json`.
    #[arg(long, hide = true, conflicts_with = "output")]
    json: bool,
}

impl OutputArgs {
    pub fn format(&self) -> Output {
        if self.json { Output::Json } else { self.output }
    }
}

/// `-o json|yaml` (default json) of a command whose result is a document only.
#[derive(Args, Debug, Clone)]
pub struct DocumentOutputArgs {
    /// Output format of the result on stdout: `json` or `yaml` (progress and notes go to
    /// stderr).
    #[arg(short = 'o', long, value_enum, default_value_t = DocumentOutput::Json)]
    output: DocumentOutput,
    /// Deprecated spelling of `-o json`.
    #[arg(long, hide = true, conflicts_with = "output")]
    json: bool,
}

impl DocumentOutputArgs {
    pub fn format(&self) -> Output {
        match (self.json, self.output) {
            (true, _) | (false, DocumentOutput::Json) => Output::Json,
            (false, DocumentOutput::Yaml) => Output::Yaml,
        }
    }
}

/// `value` as `format` asks, ending with a newline; `table` is the command's own text.
pub fn render<T: Serialize>(
    value: &T,
    format: Output,
    table: impl FnOnce() -> String,
) -> anyhow::Result<String> {
    Ok(match format {
        Output::Table => table(),
        Output::Json => format!("{}\n", serde_json::to_string_pretty(value)?),
        Output::Yaml => serde_saphyr::to_string(value)?,
    })
}

/// Prints [`render`] on stdout.
pub fn print<T: Serialize>(
    value: &T,
    format: Output,
    table: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    print!("{}", render(value, format, table)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_carry_the_same_document() {
        let doc = serde_json::json!({"table": "public.users", "rows": 3, "ok": true});
        let json = render(&doc, Output::Json, String::new).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&json).unwrap(),
            doc
        );
        let yaml = render(&doc, Output::Yaml, String::new).unwrap();
        assert_eq!(
            serde_saphyr::from_str::<serde_json::Value>(&yaml).unwrap(),
            doc
        );
        let table = render(&doc, Output::Table, || "people\n".into()).unwrap();
        assert_eq!(table, "people\n");
    }
}
