// glibc's malloc serialises on arena locks when rows are allocated on one thread and freed on
// another (the COPY reader and the snapshot writer): a third of a baseline's CPU went to malloc,
// free and futex waits. mimalloc's thread-local heaps free cross-thread without that lock.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(larch::cli::main());
}
