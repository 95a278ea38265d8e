//! Entry points of the operator subcommands (`larch crd`, `larch operator`).

/// `larch crd`: print every CRD as multi-document YAML. Returns the exit code.
pub fn crd() -> i32 {
    print!("{}", super::crd::all_yaml());
    0
}
