//! What every larch process exposes on `/metrics` besides its own figures: the standard process
//! metrics (`process_*`: CPU, resident memory, open file descriptors, start time) and
//! `larch_build_info`, and the progress of a long operation as gauges.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, IntGaugeVec, Opts, Registry};

const CPU_SECONDS: &str = "process_cpu_seconds_total";

/// The prometheus crate's process collector, except `process_cpu_seconds_total`: it reports
/// whole seconds (so `rate()` over a minute is a staircase); this one is `getrusage`'s user +
/// system time to the microsecond.
#[cfg(target_os = "linux")]
struct ProcessMetrics {
    inner: prometheus::process_collector::ProcessCollector,
    cpu: Counter,
}

#[cfg(target_os = "linux")]
impl Default for ProcessMetrics {
    fn default() -> Self {
        ProcessMetrics {
            inner: prometheus::process_collector::ProcessCollector::for_self(),
            cpu: Counter::with_opts(Opts::new(
                CPU_SECONDS,
                "Total user and system CPU time spent in seconds.",
            ))
            .expect("valid metric"),
        }
    }
}

/// User + system CPU time of this process, in seconds.
#[cfg(target_os = "linux")]
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

#[cfg(target_os = "linux")]
impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.inner.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families: Vec<MetricFamily> = self
            .inner
            .collect()
            .into_iter()
            .filter(|f| f.name() != CPU_SECONDS)
            .collect();
        let delta = cpu_seconds() - self.cpu.get();
        if delta > 0.0 {
            self.cpu.inc_by(delta);
        }
        families.extend(self.cpu.collect());
        families
    }
}

/// Registers the process collector and `larch_build_info{version,component}` (always 1) on
/// `registry`. `component`: `export`, `engine` or `operator`.
pub fn register_process_and_build_info(registry: &Registry, component: &str) {
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(ProcessMetrics::default()))
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// CPU seconds are a fraction, not whole seconds, and never decrease.
    #[test]
    fn cpu_seconds_are_fractional_and_monotonic() {
        let registry = Registry::new();
        register_process_and_build_info(&registry, "test");
        let cpu = |r: &Registry| {
            let families = r.gather();
            let f = families.iter().find(|f| f.name() == CPU_SECONDS).unwrap();
            assert_eq!(
                families.iter().filter(|f| f.name() == CPU_SECONDS).count(),
                1
            );
            f.get_metric()[0].get_counter().get_value()
        };
        let mut spin = 0u64;
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(30) {
            spin = spin.wrapping_add(1);
        }
        let first = cpu(&registry);
        assert!(first > 0.0 && first.fract() != 0.0, "{first} ({spin})");
        assert!(cpu(&registry) >= first);
        assert!(families_have_memory(&registry));
    }

    fn families_have_memory(r: &Registry) -> bool {
        r.gather()
            .iter()
            .any(|f| f.name() == "process_resident_memory_bytes")
    }
}
