//! What every larch process exposes on `/metrics` besides its own figures: the standard process
//! metrics (`process_*`: CPU, resident memory, open file descriptors, start time) and
//! `larch_build_info`, and the progress of a long operation as gauges.

use prometheus::{IntGaugeVec, Opts, Registry};

/// Registers the process collector and `larch_build_info{version,component}` (always 1) on
/// `registry`. `component`: `export`, `engine` or `operator`.
pub fn register_process_and_build_info(registry: &Registry, component: &str) {
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("process collector registered once");
    let info = IntGaugeVec::new(
        Opts::new(
            "larch_build_info",
            "Always 1; the labels say which larch build and component this is.",
        ),
        &["version", "component"],
    )
    .expect("valid metric");
    registry
        .register(Box::new(info.clone()))
        .expect("build info registered once");
    info.with_label_values(&[env!("CARGO_PKG_VERSION"), component])
        .set(1);
}
